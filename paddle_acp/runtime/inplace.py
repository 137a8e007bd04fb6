"""Restoring a saved value into the objects a script holds, in place, at every level of nesting.

The script keeps references into its state (``hist = metrics["hist"]``): :func:`restore_into` keeps the identity
of every nested list, dict or array present on both sides; what cannot be updated in place is replaced in its parent.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["restore_into"]


def restore_into(live: Any, saved: Any) -> Any:
    """The object to hold once ``saved`` is restored into ``live``: ``live`` updated in place where it can take
    ``saved``, else ``saved`` (a tuple rebuilt around its restored items)."""
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
