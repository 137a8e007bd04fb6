"""The runs of one ``paddle-acp check``: the user's command started in its own process group, with its checkpoints,
digests and output in the check's temporary directory, and every group ended with it.

Each run's environment is the caller's without any variable that would send the checkpoints elsewhere or change when
they are taken; plus a checkpoint at every epoch end, every due save taken, every range cut to ``--epochs`` epochs and,
for the first process of a killed run only, the kill point (:mod:`paddle_acp.runtime.check_kill`). The check never
reads or writes the job's own location."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from typing import Any, Dict, List, Optional, Tuple

from paddle_acp.secrets import redact_arg
from paddle_acp.tools import check_report as report
from paddle_acp.tools.discovery import ToolError

JOB = "check"
_STRIP_PREFIXES = ("PADDLE_ACP_", "PADDLE_EDL_")
_STRIP_NAMES = ("PADDLE_JOB_ID", "PADDLE_RUNNING_ENV")
_RUNNER_OPTIONS = ("--checkpoint", "--job-id", "--interval")  # of `paddle-acp run`: each takes a value
_RUNNER_PROGRAMS = ("paddle-acp", "paddle_acp_cli.py")
_RUNNER_MODULES = ("paddle_acp", "paddle_acp_cli")

Point = Tuple[str, int, Optional[int]]  # (range, epoch, step or None)


def _runner_option(word: str) -> Optional[str]:
    """The option of ``paddle-acp run`` that ``word`` names, abbreviated as argparse allows (``--check``)."""
    if not word.startswith("--") or len(word) < 3:
        return None
    names = [o for o in _RUNNER_OPTIONS + ("--help",) if o.startswith(word)]
    return names[0] if len(names) == 1 and names[0] in _RUNNER_OPTIONS else None


def strip_runner_options(command: List[str]) -> Tuple[List[str], List[str]]:
    """``command`` without the options of ``paddle-acp run`` (``python -m paddle_acp run``, ...) that would point
    its runs at the job's own checkpoints; and the options removed (not their values: a URI may hold a secret)."""
    run_at = None
    for i, word in enumerate(command[:-1]):
        if command[i + 1] != "run":
            continue
        if os.path.basename(word) in _RUNNER_PROGRAMS or (word in _RUNNER_MODULES and i > 0 and command[i - 1] == "-m"):
            run_at = i + 1
            break
    if run_at is None:
        return list(command), []
    out, removed = list(command[:run_at + 1]), []
    i = run_at + 1
    while i < len(command) and command[i].startswith("-"):
        word = command[i]
        name = _runner_option(word.split("=", 1)[0])
        if name is not None:
            removed.append(name)
            i += 1 if "=" in word else 2
            continue
        out.append(word)
        i += 1
    return out + command[i:], removed


class Runs:
    """The runs of one check, in its temporary directory ``workdir``."""

    def __init__(self, command: List[str], epochs: int, timeout: float, workdir: str, say: Any) -> None:
        self.command = command
        self.epochs = epochs
        self.timeout = timeout
        self.dir = workdir
        self.say = say
        self.groups: List[subprocess.Popen[bytes]] = []  # every process group started (its leader)

    def env(self, name: str, kill_at: Optional[Point] = None) -> Dict[str, str]:
        e = {k: v for k, v in os.environ.items() if not k.startswith(_STRIP_PREFIXES) and k not in _STRIP_NAMES}
        e.update({
            "PADDLE_ACP_CHECKPOINT_URI": os.path.join(self.dir, f"ckpt-{name}"),
            "PADDLE_JOB_ID": JOB,
            "PADDLE_ACP_SAVE_INTERVAL": "0",
            "PADDLE_ACP_BUSY_POLICY": "wait",  # every due save is taken: a checkpoint before every kill point
            "PADDLE_EDL_SAVE_CHECKPOINT_INTER": "0",
            "PADDLE_ACP_CHECK_EPOCHS": str(self.epochs),
            "PADDLE_ACP_CHECK_DIGESTS": self.digests(name),
            "PYTHONUNBUFFERED": "1",
        })
        if kill_at is not None:
            rng, epoch, step = kill_at
            e["PADDLE_ACP_CHECK_KILL_AT"] = f"{epoch}{'' if step is None else f':{step}'}@{rng}"
        return e

    def digests(self, name: str) -> str:
        return os.path.join(self.dir, f"{name}.jsonl")

    def log(self, name: str) -> str:
        return os.path.join(self.dir, f"{name}.log")

    def records(self, name: str) -> Dict[int, List[Dict[str, Any]]]:
        return report.read_ranks(self.digests(name))

    def start(self, name: str, kill_at: Optional[Point] = None) -> subprocess.Popen[bytes]:
        out = open(self.log(name), "ab")
        try:
            proc = subprocess.Popen(self.command, env=self.env(name, kill_at), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            raise ToolError(f"cannot run {redact_arg(self.command[0])!r}: {exc}") from exc
        finally:
            out.close()
        self.groups.append(proc)
        return proc

    def wait(self, proc: subprocess.Popen[bytes], name: str, started: float) -> int:
        """The exit status of the run's process; then whatever it left in its group is killed."""
        try:
            rc = proc.wait(timeout=max(1.0, self.timeout - (time.monotonic() - started)))
        except subprocess.TimeoutExpired:
            raise ToolError(f"the {name} run did not end within {self.timeout:g} s (--timeout); its output: "
                            f"{self.log(name)}") from None
        finally:
            self.end(proc)
        return rc

    def end(self, proc: subprocess.Popen[bytes]) -> None:
        """Kill what is left of the process group of ``proc`` and reap its leader."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        proc.wait()
        if proc in self.groups:
            self.groups.remove(proc)

    def end_all(self) -> None:
        """Every process group this check started ends (Ctrl-C, SIGTERM, an error)."""
        for proc in list(self.groups):
            self.end(proc)

    def _failed(self, name: str, rc: int) -> ToolError:
        return ToolError(f"the {name} run failed with exit status {rc}:\n{tail(self.log(name))}")

    def uninterrupted(self, name: str) -> Dict[str, Any]:
        started = time.monotonic()
        rc = self.wait(self.start(name), name, started)
        if rc != 0:
            raise self._failed(name, rc)
        return {"name": name, "returncode": rc, "seconds": round(time.monotonic() - started, 3),
                "ranks": len(self.records(name))}

    def killed(self, name: str, point: Point) -> Dict[str, Any]:
        """Run with the kill point set (the runtime kills itself there), then restart without it."""
        started = time.monotonic()
        where = report.point_text({"range": point[0], "epoch": point[1], "step": point[2]})
        rc = self.wait(self.start(name, kill_at=point), name, started)
        by_rank = self.records(name)
        kills = [r for recs in by_rank.values() for r in recs if r.get("kind") == "kill"]
        if not kills:
            if rc != 0:
                raise self._failed(name, rc)
            raise ToolError(f"the {name} run ended without reaching its kill point ({where}): that point is "
                            f"not in the run; its output: {self.log(name)}")
        kill = min(kills, key=lambda r: int(r.get("rank", 0)))
        at = {"range": kill["range"], "epoch": kill["epoch"], "step": kill.get("step") if point[2] is not None else None}
        self.say(f"killed (SIGKILL) at {report.point_text(at)}, after the checkpoints before it were committed; "
                 "restarting")
        before = {rank: len(recs) for rank, recs in by_rank.items()}
        rc = self.wait(self.start(name), name, started)
        if rc != 0:
            raise self._failed(f"{name} (restarted)", rc)
        after = self.records(name).get(0, [])[before.get(0, 0):]
        starts = [r for r in after if r.get("kind") == "start" and r["range"] == point[0]]
        return {"name": name, "returncode": rc, "seconds": round(time.monotonic() - started, 3), "killed_at": at,
                "resumed_at_epoch": starts[0]["epoch"] if starts else None,
                "resumed_mid_epoch": bool(starts[0].get("resumed_mid_epoch")) if starts else False,
                "ranks": len(by_rank)}


def tail(path: str, n: int = 3000) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return ""
    return data[-n:].decode("utf-8", "replace")
