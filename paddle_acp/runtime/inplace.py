"""Restoring a saved value into the objects a script holds, in place, at every level of nesting.

The script keeps references into its state (``hist = metrics["hist"]``, ``lst = v.value``): a
restore that replaced the inner containers would leave it appending to detached ones.
:func:`restore_into` writes a saved value into the live one instead: a list by slice
assignment, a dict by clear and update, keeping the identity of every nested list, dict or
array that exists on both sides (at the same index or key), and a NumPy array by copying into
it when its shape and dtype match (and it is writeable). What cannot be updated in place (a
number, a string, a container whose type changed) is replaced in its parent; a tuple (immutable)
is rebuilt around its restored items.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["restore_into"]


def restore_into(live: Any, saved: Any) -> Any:
    """The object to hold once ``saved`` is restored into ``live``: ``live`` itself, updated in
    place, where it is a list, dict or array that can take ``saved``; else ``saved`` (its items
    restored into ``live``'s where they can be, for a tuple)."""
    if isinstance(live, dict) and isinstance(saved, dict):
        merged = {k: restore_into(live[k], v) if k in live else v for k, v in saved.items()}
        live.clear()
        live.update(merged)
        return live
    if isinstance(live, list) and isinstance(saved, list):
        live[:] = [restore_into(live[i], v) if i < len(live) else v for i, v in enumerate(saved)]
        return live
    if (isinstance(live, np.ndarray) and isinstance(saved, np.ndarray) and live.flags.writeable
            and live.shape == saved.shape and live.dtype == saved.dtype):
        live[...] = saved
        return live
    if type(live) is tuple and type(saved) is tuple and len(live) == len(saved):
        return tuple(restore_into(a, b) for a, b in zip(live, saved))
    return saved
