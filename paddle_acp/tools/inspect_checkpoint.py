"""``paddle-acp inspect``: one checkpoint's manifest (programs, variables and their kinds, LR scheduler, RNG, the
Paddle version and IR it was made with, the script's own saved objects and other values, shown bounded and redacted by
:mod:`.values`), its data file, and whether a restart loads it. A variable's kind (parameter, optimizer state, learning
rate) comes from Paddle's naming, as does its ``export`` file (``.pdparams``/``.pdopt``, as ``paddle.static.save``)."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from paddle_acp.format.manifest import DATA_NAME, Manifest
from paddle_acp.tools.refs import load_manifest, read_part, resolve_checkpoint
from paddle_acp.tools.render import clean, fmt_time, human_bytes, output, table
from paddle_acp.tools.scan import CORRUPT, VERIFIED, CkptInfo, restart_checkpoint, restart_outcome, scan_range
from paddle_acp.tools.values import extra_values, render_extra, rng_summary, rng_text

_LR_RE = re.compile(r"^(learning_rate(_\d+)?|.*@.*)$")
_ACC_TAIL_RE = re.compile(r"^_[A-Za-z][A-Za-z0-9_]*_\d+$")


def tensor_kinds(names: Sequence[str]) -> Dict[str, str]:
    """name -> "param", "optimizer" or "lr": an accumulator is named ``<parameter>_<accumulator>_<n>`` after another
    variable of the program (``w_moment1_0``, ``w_fp32_master_0``); ``learning_rate_<n>`` and counters with an '@' are
    "lr"; everything else (weights, batch-norm statistics) is a parameter."""
    present = set(names)
    kinds = {}
    for n in names:
        kind = "param"
        if _LR_RE.match(n):
            kind = "lr"
        else:
            for i, ch in enumerate(n):
                if ch == "_" and i and n[:i] in present and _ACC_TAIL_RE.match(n[i:]):
                    kind = "optimizer"
                    break
        kinds[n] = kind
    return kinds


def program_ir(label: str, manifest_ir: str) -> str:
    """The IR of one program: its label starts with it ("pir: 61 ops, ...")."""
    head = label.split(":", 1)[0].strip()
    if head in ("pir", "legacy"):
        return head
    return "legacy" if manifest_ir == "legacy" else "pir"


def export_split(names: Sequence[str], ir: str) -> Dict[str, str]:
    """name -> "pdparams" or "pdopt", as ``paddle.static.save`` splits them (PIR: the learning rate is a parameter)."""
    return {n: "pdparams" if kind == "param" or (kind == "lr" and ir == "pir") else "pdopt"
            for n, kind in tensor_kinds(names).items()}


@dataclasses.dataclass
class InspectResult:
    uri: str
    job: str
    manifest: Manifest
    data_file_size: Optional[int]  # None: the data file is missing
    restart: Optional[str]  # the name of the checkpoint a restart loads (None: none is valid)
    this: Optional[CkptInfo]  # this checkpoint as the range's scan saw it (its data status)
    programs: List[Dict[str, Any]]  # key, label, lr_scheduler, tensors (each with its kind)
    name: str = ""  # the checkpoint's directory name
    part: Optional[Dict[str, Any]] = None  # several ranks: rank, ranks, world_size, mode of the part shown
    outcome: str = ""  # what a restart of the range does, in words (scan.restart_outcome)

    @property
    def loads(self) -> bool:
        return self.restart == self.name


def inspect(checkpoint: str, job: Optional[str] = None, range_name: Optional[str] = None,
            number: Optional[int] = None, rank: Optional[int] = None) -> InspectResult:
    ref = resolve_checkpoint(checkpoint, job, range_name, number, rank)
    m = load_manifest(ref)
    part = None
    if ref.multirank:
        g, raws = read_part(ref)
        part = {"rank": ref.rank, "ranks": sorted(raws), "world_size": g.world_size, "mode": g.mode}
        if g.writers == "all":  # the part holds its rank's share of the replicated tensors
            part["writers"] = g.writers
            part["share_writers"] = g.share_writers
    data_size = None
    with contextlib.suppress(FileNotFoundError):
        data_size = ref.storage.size(f"{ref.part_path}/{DATA_NAME}")
    if ref.scanned is not None:  # resolved to the checkpoint a restart loads: found (and its data read) already
        infos = ref.scanned
        restart = next((i for i in infos if i.restart), None)
    else:
        infos = scan_range(ref.storage, ref.job, ref.range)
        restart = restart_checkpoint(ref.storage, ref.job, ref.range, infos)
    this = next((i for i in infos if i.name == ref.dir_name and i.committed), None)
    programs = []
    for p in m.programs:
        kinds = {n: {"lr": "learning rate"}.get(k, k) for n, k in tensor_kinds([t.name for t in p.tensors]).items()}
        programs.append({"key": p.key, "label": p.label, "lr_scheduler": p.lr_scheduler,
                         "tensors": [dict(t.to_json(), kind=kinds[t.name]) for t in p.tensors]})
    return InspectResult(ref.uri, ref.job, m, data_size, restart.name if restart else None, this, programs,
                         ref.dir_name, part, restart_outcome(infos, True))


def to_json(res: InspectResult) -> Dict[str, Any]:
    m, this = res.manifest, res.this
    return {"checkpoint": res.uri, "job": res.job, "range": m.range.to_json(), "number": m.number,
            "created": m.created, "paddle_version": m.paddle_version, "ir": m.ir, "rng": rng_summary(m.rng),
            "data_size": m.data_size, "data_file_size": res.data_file_size, "restart": res.loads,
            "data_status": this.status if this is not None else None,
            "data_problem": (this.reason or None) if this is not None else None,
            "extra_keys": sorted(m.extra), "extra": extra_values(m.extra), "programs": res.programs,
            **({"part": res.part} if res.part is not None else {})}


def _data_text(res: InspectResult) -> str:
    m, size, this = res.manifest, res.data_file_size, res.this
    if size is None:
        return f"{DATA_NAME} MISSING (manifest says {m.data_size} bytes)"
    if size != m.data_size:
        return f"{DATA_NAME} {size} bytes, manifest says {m.data_size}: CORRUPT"
    if this is not None and this.status == CORRUPT:
        return f"{DATA_NAME} {human_bytes(size)}: CORRUPT ({this.reason})"
    if this is not None and this.status == VERIFIED:
        return f"{DATA_NAME} {human_bytes(size)} ({size} bytes; every checksum verified)"
    return f"{DATA_NAME} {human_bytes(size)} ({size} bytes; checksums: run `paddle-acp verify`)"


def _part_rows(res: InspectResult) -> List[Tuple[str, str]]:
    if res.part is None:
        return []
    p = res.part
    others = [r for r in p["ranks"] if r != p["rank"]]
    more = f"; --rank {others[0]} shows another" if others else ""
    if p.get("writers") == "all":  # spread writes (format/engine/shares.py): each part holds a share of the tensors
        n = p.get("share_writers", p["world_size"])
        who = "each rank writes a share of the tensors" if n == p["world_size"] else \
            f"ranks 0..{n - 1} each write a share of the tensors"
        what = "its share" if p["rank"] < n else "no tensors (not a share writer)"
        return [("written by", f"{p['world_size']} ranks ({p['mode']}, {who}); "
                               f"this is the part of rank {p['rank']}, {what}{more}")]
    if p["world_size"] == 1:
        return [("written by", "1 rank (a job of one process)")]
    return [("written by", f"{p['world_size']} ranks ({p['mode']}); this is the part of rank {p['rank']}{more}")]


def render(res: InspectResult) -> str:
    m = res.manifest
    r = m.range
    where = "end of epoch" if r.step is None else f"mid-epoch, after {r.step} step(s) of epoch {r.epoch_no}"
    if res.loads:
        loads = "yes"
    elif res.restart is None:
        loads = f"no (a restart {res.outcome})"
    else:
        loads = f"no (a restart loads {res.restart})"
    rows = [
        ("checkpoint", res.uri),
        *([("number", str(m.number))] if res.part is None else []),  # (a position's number: its name says it)
        ("created", fmt_time(m.created)),
        ("job / range", f"{res.job} / {r.name}"),
        *_part_rows(res),
        ("epoch", f"{r.epoch_no} (max_epoch_num {r.max_epoch_num}), {where}"),
        ("restart loads it", loads),
        ("made with", f"Paddle {m.paddle_version or '?'}, IR {m.ir or '?'}"),
        ("RNG saved", rng_text(rng_summary(m.rng))),
        ("data", _data_text(res)),
    ]
    w = max(len(k) for k, _ in rows)
    lines = [f"{k.ljust(w)}  {clean(v)}" for k, v in rows]  # (texts of the manifest: on their own line each)
    for title, block in render_extra(extra_values(m.extra), r.epoch_no):
        lines += ["", title, *block]
    for p in res.programs:
        n_param = sum(1 for t in p["tensors"] if t["kind"] == "param")
        lines += ["", f"program {clean(p['key'])}  ({clean(p['label'])})"]
        sched = p["lr_scheduler"]
        lines.append("  LR scheduler: " + (", ".join(f"{clean(k)}={json.dumps(v)}" for k, v in sorted(sched.items()))
                                           if sched is not None else "none saved"))
        trows = [[t["name"], t["kind"], t["dtype"], "[" + ", ".join(map(str, t["shape"])) + "]",
                  t["nbytes"] if "piece" not in t else f"{t['nbytes']} (its bytes {t['piece'][0]}..{t['piece'][1]})"]
                 for t in p["tensors"]]  # a piece: a byte range of the tensor (spread writes)
        lines.append(table(["VARIABLE", "KIND", "DTYPE", "SHAPE", "BYTES"], trows, right=(4,), indent="  "))
        total = sum(t["nbytes"] for t in p["tensors"])
        lines.append(f"  {len(p['tensors'])} variables, {human_bytes(total)}; "
                     f"{n_param} parameters, {len(p['tensors']) - n_param} optimizer variables (learning rate included)")
    return "\n".join(lines)


def add_ref_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("checkpoint", metavar="CHECKPOINT",
                   help="URI/JOB/range/RANGE/ckpt-e<E>[-s<S>] (an earlier release's: ckpt-N), or the storage root URI "
                   "with --job/--range")
    p.add_argument("--job", help="job id (with a storage root URI; optional when there is one job)")
    p.add_argument("--range", help="range name, e.g. _range_0 (optional when the job has one range)")
    p.add_argument("--number", type=int,
                   help="the number N of an earlier release's checkpoint ckpt-N (default: the one a restart loads)")
    p.add_argument("--rank", type=int, metavar="K",
                   help="of a checkpoint of several ranks (ckpt-e<E>[-s<S>]): the part of rank K (default 0)")


def register(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser("inspect", help="show one checkpoint's manifest", description="Show "
                                                "a checkpoint's programs, variables, LR scheduler, RNG and the Paddle "
                                                "version/IR it was made with.")
    add_ref_args(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    return p


def main(args: argparse.Namespace) -> int:
    output(inspect(args.checkpoint, args.job, args.range, args.number, args.rank), args.json, to_json, render)
    return 0
