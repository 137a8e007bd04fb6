"""``paddle-acp export``: one program's parameters (and with ``--optimizer-state`` its optimizer
variables) as ``DIR/NAME.pdparams`` (``NAME.pdopt``), the format of ``paddle.static.save``: loadable
with plain Paddle, without paddle-acp. Every checksum is verified first; only ``--to`` is written: never
inside a job directory of the root, never over an earlier export of that name unless ``--overwrite``."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import time
from typing import Any, Dict, List, Optional, Tuple

from paddle_acp.format.engine import reader, shares
from paddle_acp.format.manifest import Manifest, ProgramRecord
from paddle_acp.tools.discovery import ToolError, list_jobs
from paddle_acp.tools.inspect_checkpoint import add_ref_args, export_split, program_ir
from paddle_acp.tools.reading import read_checkpoint
from paddle_acp.tools.refs import CkptRef, load_manifest, read_part, reading, resolve_checkpoint
from paddle_acp.tools.render import human_bytes, output, table

EXPORT_FILES = (".pdparams", ".pdopt", ".export.json")


@dataclasses.dataclass
class ExportResult:
    uri: str
    program: str
    epoch: int
    prefix: str
    files: List[Tuple[str, int, int]]  # (path, variables, bytes)
    info_path: str  # provenance and LR scheduler state
    optimizer_state: bool


def pick_program(m: Manifest, key: Optional[str], ref: CkptRef) -> ProgramRecord:
    keys = [p.key for p in m.programs]
    if not keys:
        raise ToolError(f"checkpoint {ref.uri} holds no programs")
    if key is None:
        if len(keys) == 1:
            return m.programs[0]
        raise ToolError(f"checkpoint {ref.uri} holds {len(keys)} programs ({', '.join(keys)}): choose one with --program")
    matches = [p for p in m.programs if p.key == key] or [p for p in m.programs if p.key.startswith(key)]
    if len(matches) != 1:
        what = "matches several" if matches else "matches none"
        raise ToolError(f"--program {key!r} {what} of the programs in {ref.uri} ({', '.join(keys)})")
    return matches[0]


def write_pickle(path: str, obj: Any) -> int:
    """``obj`` pickled as ``paddle.save``/``paddle.static.save`` write it, atomically; its size."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        pickle.dump(obj, f, protocol=4)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return os.path.getsize(path)


def check_output(ref: CkptRef, to: str, prefix: str, overwrite: bool) -> None:
    """Refuse ``to`` inside a job directory of a local root (gc would delete the export with the checkpoints),
    and files of an earlier export named ``prefix`` unless ``overwrite``."""
    root = ref.storage.local_path("")
    real = os.path.realpath(to)
    for job in sorted({ref.job, *list_jobs(ref.storage)}) if root is not None else []:
        jdir = os.path.realpath(os.path.join(str(root), job))
        if os.path.commonpath([real, jdir]) == jdir:
            raise ToolError(f"--to {to!r} is inside job directory {jdir!r} of the checkpoint root (gc deletes what "
                            "is there with the checkpoints): choose a directory outside the job directories")
    old = [prefix + ext for ext in EXPORT_FILES if os.path.lexists(prefix + ext)]
    if old and not overwrite:
        raise ToolError(f"an export is already there ({', '.join(old)}): pass --overwrite to replace it, "
                        "or choose another --to or --name")


def spread_parts(ref: CkptRef) -> Optional[Dict[int, Manifest]]:
    """Every part's manifest of a checkpoint whose ranks wrote shares of the replicated tensors, else None."""
    if not ref.multirank:
        return None
    with reading(ref):
        g, raws = read_part(ref)  # the shares checked to cover the state exactly
        if g.writers != shares.WRITERS_ALL:
            return None
        return {k: reader.read_manifest(ref.storage, f"{ref.path}/rank-{k}", g.number, ref.range, raw)
                for k, raw in raws.items()}


def tensor_part(ref: CkptRef) -> CkptRef:
    """The part whose tensors ``ref``'s rank restores (as a rank's restore picks it): rank 0's of a
    replicated checkpoint that rank 0 wrote alone, else ``ref`` itself."""
    if not ref.multirank or ref.rank == 0:
        return ref
    with reading(ref):
        g, _ = read_part(ref)
    if g.mode != "replicated" or g.writers == shares.WRITERS_ALL:
        return ref
    return dataclasses.replace(ref, rank=0)


def export(checkpoint: str, to: str, job: Optional[str] = None, range_name: Optional[str] = None,
           number: Optional[int] = None, program: Optional[str] = None, name: str = "model",
           optimizer_state: bool = False, rank: Optional[int] = None, overwrite: bool = False) -> ExportResult:
    ref = resolve_checkpoint(checkpoint, job, range_name, number, rank)
    m = load_manifest(ref)
    spread = spread_parts(ref)
    if spread is not None:  # every share's tensors (format/engine/shares.py), the manifest of ``ref``'s rank
        m = dataclasses.replace(m, programs=shares.merged_programs(spread, ref.rank))
    source = ref if spread is not None else tensor_part(ref)
    if source is not ref:  # rank 0's tensors, this rank's record (provenance, position)
        m = dataclasses.replace(m, programs=load_manifest(source).programs)
    prog = pick_program(m, program, ref)
    ir = program_ir(prog.label, m.ir)
    split = export_split([t.name for t in prog.tensors], ir)
    if not name or "/" in name or name in (".", ".."):
        raise ToolError(f"--name {name!r} must be a plain file name prefix")
    prefix = os.path.join(to, name)
    check_output(ref, to, prefix, overwrite)
    want = {(prog.key, t.name) for t in prog.tensors if optimizer_state or split[t.name] == "pdparams"}
    with reading(ref, "cannot export checkpoint {uri}: it is corrupt ({reason})"):
        if spread is None:
            _, arrays = read_checkpoint(ref.storage, ref.job, ref.range, ref.number, want, verb="exporting",
                                        base=source.part_path)
        else:
            by_part = {}  # rank -> its verified tensors (or pieces of tensors) that ``want`` names
            for k, part in sorted(spread.items()):
                theirs = {(p.key, t.name) for p in part.programs for t in p.tensors} & want
                if theirs:
                    by_part[k] = read_checkpoint(ref.storage, ref.job, ref.range, ref.number, theirs,
                                                 verb="exporting", base=f"{ref.path}/rank-{k}")[1]
            arrays = shares.assemble(spread, by_part, want)
    params = {t.name: arrays[(prog.key, t.name)] for t in prog.tensors if split[t.name] == "pdparams"}
    opt = {t.name: arrays[(prog.key, t.name)] for t in prog.tensors
           if split[t.name] == "pdopt" and (prog.key, t.name) in arrays}
    try:
        os.makedirs(to, exist_ok=True)
    except OSError as exc:
        raise ToolError(f"cannot create --to directory {to!r}: {exc}") from exc
    files = []
    try:
        if not optimizer_state and os.path.lexists(prefix + ".pdopt"):  # --overwrite: no stale moments beside
            os.remove(prefix + ".pdopt")
        files.append((prefix + ".pdparams", len(params), write_pickle(prefix + ".pdparams", params)))
        if optimizer_state:
            files.append((prefix + ".pdopt", len(opt), write_pickle(prefix + ".pdopt", opt)))
        info = {"source": ref.uri, **({"rank": ref.rank} if ref.multirank else {}), "number": m.number,
                "range": m.range.to_json(), "program": prog.key, "label": prog.label,
                "paddle_version": m.paddle_version, "ir": ir, "created": m.created, "exported": time.time(),
                "parameters": sorted(params), "optimizer_state": sorted(opt) if optimizer_state else None,
                "lr_scheduler": prog.lr_scheduler}
        info_path = prefix + ".export.json"
        with open(info_path, "w") as f:
            json.dump(info, f, indent=2)
    except OSError as exc:
        raise ToolError(f"cannot write to {to!r}: {exc}") from exc
    return ExportResult(ref.uri, prog.key, m.range.epoch_no, prefix, files, info_path, optimizer_state)


def to_json(res: ExportResult) -> Dict[str, Any]:
    return {"checkpoint": res.uri, "program": res.program, "epoch": res.epoch, "info": res.info_path,
            "files": [{"path": p, "variables": n, "bytes": s} for p, n, s in res.files]}


def render(res: ExportResult) -> str:
    rows: List[List[Any]] = [[p, n, human_bytes(s)] for p, n, s in res.files]
    rows.append([res.info_path, "-", "(provenance, LR scheduler state)"])
    lines = [f"exported program {res.program} of checkpoint {res.uri} (epoch {res.epoch})",
             table(["FILE", "VARIABLES", "SIZE"], rows, right=(1,)),
             "",
             "load it with plain Paddle (static graph):",
             f"  paddle.static.set_program_state(program, paddle.load({res.prefix + '.pdparams'!r}, return_numpy=True))"]
    if res.optimizer_state:
        lines.append(f"  paddle.static.load(program, {res.prefix!r})   # parameters and optimizer state")
    else:
        lines.append(f"  paddle.static.load_program_state({res.prefix!r})   # name -> numpy array")
    return "\n".join(lines)


def register(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser("export", help="write a program's parameters in Paddle's own format (.pdparams/.pdopt)",
                       description="Write the parameters of one program of a checkpoint (and with --optimizer-state the "
                       "optimizer variables) as DIR/NAME.pdparams (and NAME.pdopt), the format of paddle.static.save: "
                       "load them with paddle.static.load, paddle.static.set_program_state or paddle.load, without paddle-acp.")
    add_ref_args(p)
    p.add_argument("--program", metavar="KEY", help="program key (or a unique prefix); see `paddle-acp inspect`")
    p.add_argument("--to", required=True, metavar="DIR", help="local output directory")
    p.add_argument("--name", default="model", help="file name prefix (default: model)")
    p.add_argument("--optimizer-state", action="store_true", help="also write the optimizer variables to NAME.pdopt")
    p.add_argument("--overwrite", action="store_true", help="replace an earlier export of NAME in DIR (its files; "
                   "a NAME.pdopt this export does not write is removed)")
    p.add_argument("--json", action="store_true", help="machine-readable output (the files written)")
    return p


def main(args: argparse.Namespace) -> int:
    res = export(args.checkpoint, args.to, args.job, args.range, args.number, args.program, args.name,
                 args.optimizer_state, args.rank, args.overwrite)
    output(res, args.json, to_json, render)
    return 0
