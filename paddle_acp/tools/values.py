"""What ``paddle-acp inspect`` shows of the values a checkpoint's manifest holds besides its tensors (``extra``: the
script's objects, the data loader's state, the RNG at a mid-epoch checkpoint's epoch start): each value as one bounded
line, the way Python writes it, shortened.

Redacted before anything is cut: a string's registered secrets and every URI's user info and query, and the value of a
key named like a credential (:func:`paddle_acp.secrets.secret_name`), a dict's key or a saved object's own name
(``state={"db_password": ...}``), unless numeric (so RNG ``key`` arrays show)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import numpy as np

from paddle_acp.format import objstate
from paddle_acp.secrets import redact_text, scrub, secret_name

__all__ = ["WIDTH", "extra_values", "preview"]

WIDTH = 160  # characters of one value's line
ITEMS = 6  # items of a list, tuple or dict shown
DEPTH = 4  # levels of nesting shown
TEXT = 60  # characters of a string shown
DIGITS = 24  # digits of an integer shown (a PCG64 state has 39)
HIDDEN = "***"


def preview(value: Any, width: int = WIDTH, hidden: bool = False) -> str:
    """``value`` (decoded from a manifest) as one line of at most ``width`` characters, redacted; ``hidden``: its
    strings shown as ``***`` (the value of a name like a credential's)."""
    text = _show(value, 1, hidden)
    return text if len(text) <= width else text[: width - 1] + "…"


def _text(s: str) -> str:
    s = redact_text(s)
    return repr(s if len(s) <= TEXT else s[:TEXT] + "…")


def _show(v: Any, depth: int, hidden: bool) -> str:
    if isinstance(v, str):
        return HIDDEN if hidden else _text(v)
    if isinstance(v, (bool, type(None), float)):
        return repr(v)
    if isinstance(v, int):
        s = str(v)
        return s if len(s) <= DIGITS else f"{s[:8]}…{s[-4:]} ({len(s.lstrip('-'))} digits)"
    if isinstance(v, np.generic):
        return f"{v.dtype.name}({_show(v.item(), depth, hidden)})"
    if isinstance(v, np.ndarray):
        flat = v.reshape(-1)
        head = ", ".join(_show(x.item(), depth, hidden) for x in flat[:ITEMS])
        more = ", …" if flat.size > ITEMS else ""
        return f"array({v.dtype.name}, shape {list(v.shape)}: [{head}{more}])"
    if isinstance(v, (list, tuple, dict)):
        brackets = "{}" if isinstance(v, dict) else "()" if isinstance(v, tuple) else "[]"
        opening, closing = brackets[0], brackets[1]
        if depth >= DEPTH:
            return f"{opening}… {len(v)} item(s){closing}"
        if isinstance(v, dict):
            parts = [f"{_text(str(k))}: {_show(x, depth + 1, hidden or secret_name(str(k)))}"
                     for k, x in list(v.items())[:ITEMS]]
        else:
            parts = [_show(x, depth + 1, hidden) for x in list(v)[:ITEMS]]
        if len(v) > ITEMS:
            parts.append(f"… {len(v)} items")
        return opening + ", ".join(parts) + ("," if isinstance(v, tuple) and len(v) == 1 else "") + closing
    return f"<{type(v).__name__}>"  # decode() returns nothing else


def _objects(section: Any) -> Dict[str, List[Dict[str, str]]]:
    """An ``objects`` section (format/objstate.py): per part ("rng", "state") its objects' names, kinds and values."""
    rng, state = objstate.validate(section)
    return {part: [{"name": scrub(name), "kind": kind, "value": preview(value, hidden=secret_name(name))}
                   for name, (kind, value) in objs.items()]
            for part, objs in (("rng", rng), ("state", state))}


def extra_values(extra: Dict[str, Any]) -> Dict[str, Any]:
    """The manifest's ``extra`` as ``inspect`` shows it: ``objects`` and ``epoch_start_objects`` per object,
    ``epoch_start_rng`` summarized, any other value as one line (``part``: shown by ``inspect`` itself)."""
    out: Dict[str, Any] = {}
    for key in sorted(extra):
        v = extra[key]
        if key == "part" or v is None:
            continue
        if key in ("objects", "epoch_start_objects"):
            out[key] = _objects(v)
        elif key == "epoch_start_rng":
            out[key] = rng_summary(v)
        else:
            out[scrub(key)] = preview(v, hidden=secret_name(key))  # plain JSON data
    return out


def rng_summary(rng: Optional[Dict[str, Any]]) -> Dict[str, Any]:
    """Which RNG states a manifest's ``rng`` record holds (Paddle's generators, NumPy's, Python's)."""
    if not rng:
        return {"saved": False}
    return {
        "saved": True,
        "paddle_generators": len(rng.get("paddle") or []),
        "numpy": rng.get("numpy") is not None,
        "python": rng.get("python") is not None,
    }


def rng_text(rng: Dict[str, Any]) -> str:
    if not rng["saved"]:
        return "no"
    yn = {True: "yes", False: "no"}
    return (f"yes (Paddle: {rng['paddle_generators']} generator(s), NumPy: {yn[rng['numpy']]}, "
            f"Python: {yn[rng['python']]})")


def render_extra(values: Dict[str, Any], epoch: int) -> List[Tuple[str, List[str]]]:
    """(heading, lines) blocks of :func:`extra_values` for the text output."""
    blocks = []
    for key, title in (("objects", "script state (restored into the script's objects at a restart)"),
                       ("epoch_start_objects", f"script state at the start of epoch {epoch} "
                                               "(a mid-epoch restart replays the epoch from it)")):
        section = values.get(key)
        if section is None:
            continue
        rows = [(part.upper() if part == "rng" else part, o["name"], o["kind"], o["value"])
                for part in ("rng", "state") for o in section[part]]
        if not rows:
            blocks.append((title, ["  (none)"]))
            continue
        w1, w2 = max(len(r[1]) for r in rows), max(len(r[2]) for r in rows)
        blocks.append((title, [f"  {r[0]:<5} {r[1]:<{w1}}  {r[2]:<{w2}}  {r[3]}" for r in rows]))
    lines = [f"  {key}: {rng_text(v) if key == 'epoch_start_rng' else v}"
             for key, v in values.items() if key not in ("objects", "epoch_start_objects")]
    if lines:
        blocks.append(("other saved values", lines))
    return blocks
