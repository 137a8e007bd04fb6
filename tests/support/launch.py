"""One launcher of the ranks of a job, shared by the tests and the benchmarks (ci/bench/).

A job is W processes of ``tests/scripts/rank_train.py``, rank ``r`` with ``PADDLE_TRAINER_ID=r``,
``PADDLE_TRAINERS_NUM=W`` and ``ACP_TEST_GEN`` (which start of the job it is), writing its output to
``<out_root>/r<r>``, in the environment of :func:`support.e2e.script_env` (the checkpoint location,
nothing inherited that would steer a checkpointer), run from the repository root.
"""
from __future__ import annotations

import os
import subprocess
import sys
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence

from support.e2e import REPO, script_env

RANK_SCRIPT = os.path.join(REPO, "tests", "scripts", "rank_train.py")


def rank_cmd(out_dir: Any, args: Sequence[Any] = (), barrier: Any = None, rank_args: Sequence[Any] = (),
             no_acp: bool = False) -> List[str]:
    """The command line of one rank: ``args``, then ``--barrier DIR`` (the file barrier at every epoch
    that keeps the ranks in lockstep), then ``rank_args`` (this rank's own), then ``--no-acp``."""
    cmd = [sys.executable, RANK_SCRIPT, "--out", str(out_dir)] + [str(a) for a in args]
    if barrier is not None:
        cmd += ["--barrier", str(barrier)]
    cmd += [str(a) for a in rank_args]
    if no_acp:
        cmd.append("--no-acp")
    return cmd


def rank_vars(rank: int, world: int, gen: str, env: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """Rank ``rank``'s own variables of a ``world``-rank job's start ``gen``, then ``env`` over them."""
    return {"PADDLE_TRAINER_ID": rank, "PADDLE_TRAINERS_NUM": world, "ACP_TEST_GEN": gen, **(env or {})}


def popen_ranks(out_root: Any, world: int, args: Sequence[Any], ckpt: Any, gen: str, *,
                env: Optional[Mapping[str, Any]] = None, barrier: Any = None,
                rank_args: Optional[Mapping[int, Sequence[Any]]] = None, no_acp: bool = False, ir: str = "pir",
                ranks: Optional[Iterable[int]] = None, **popen: Any) -> List[subprocess.Popen]:
    """Start the ranks of one job (``ranks``: only those; default all ``world``), each a ``Popen`` with
    ``popen``'s keywords (e.g. ``stdout=subprocess.PIPE``). ``ckpt`` None: no checkpoint location (with
    ``no_acp``, a plain run); ``env`` goes to every rank, ``rank_args`` maps a rank to its extra arguments."""
    procs = []
    for r in range(world) if ranks is None else ranks:
        cmd = rank_cmd(os.path.join(str(out_root), f"r{r}"), args, barrier, (rank_args or {}).get(r, ()), no_acp)
        procs.append(subprocess.Popen(cmd, env=script_env(ckpt, ir, rank_vars(r, world, gen, env)), cwd=REPO, **popen))
    return procs
