"""``paddle-acp check -- CMD ...``: does this training command resume exactly after a kill?

Runs the user's own command (unchanged) three ways, each with its checkpoints in a temporary
directory, a checkpoint at every epoch end and every range cut to ``--epochs`` epochs
(``PADDLE_ACP_CHECK_EPOCHS``): uninterrupted, uninterrupted again, and SIGKILLed inside an epoch
after a checkpoint was committed, then restarted. The runtime appends what it sees at every epoch end
to the file ``PADDLE_ACP_CHECK_DIGESTS`` names (:mod:`paddle_acp.runtime.digests`); the verdict
(:mod:`.check_report`) is *resumes exactly* (exit 0), *not deterministic even without a kill* (1) or
*resumes differently* (2). A command that cannot be checked (it fails, it ends before it can be killed
inside an epoch) exits with 3.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional, Set

from paddle_acp.config import StorageOptions
from paddle_acp.storage.base import Storage
from paddle_acp.storage.schemes import open_storage
from paddle_acp.tools import check_report as report
from paddle_acp.tools.discovery import ToolError
from paddle_acp.tools.render import emit, emit_json
from paddle_acp.tools.scan import scan_range

JOB = "check"
_POLL = 0.005  # seconds between looks at the killed run's digests
# Variables of the caller that would send the runs' checkpoints elsewhere or change when they are taken.
_STRIP_PREFIXES = ("PADDLE_ACP_", "PADDLE_EDL_")
_STRIP_NAMES = ("PADDLE_JOB_ID", "PADDLE_RUNNING_ENV")


class _Runs:
    """The runs of one check, in a temporary directory."""

    def __init__(self, command: List[str], epochs: int, timeout: float, workdir: str, quiet: bool):
        self.command = command
        self.epochs = epochs
        self.timeout = timeout
        self.dir = workdir
        self.quiet = quiet

    def say(self, text: str) -> None:
        if not self.quiet:
            print(f"paddle-acp check: {text}", file=sys.stderr, flush=True)

    def env(self, name: str) -> Dict[str, str]:
        e = {k: v for k, v in os.environ.items() if not k.startswith(_STRIP_PREFIXES) and k not in _STRIP_NAMES}
        e.update({
            "PADDLE_ACP_CHECKPOINT_URI": os.path.join(self.dir, f"ckpt-{name}"),
            "PADDLE_JOB_ID": JOB,
            "PADDLE_ACP_SAVE_INTERVAL": "0",
            "PADDLE_EDL_SAVE_CHECKPOINT_INTER": "0",
            "PADDLE_ACP_CHECK_EPOCHS": str(self.epochs),
            "PADDLE_ACP_CHECK_DIGESTS": self.digests(name),
            "PYTHONUNBUFFERED": "1",
        })
        return e

    def digests(self, name: str) -> str:
        return os.path.join(self.dir, f"{name}.jsonl")

    def log(self, name: str) -> str:
        return os.path.join(self.dir, f"{name}.log")

    def start(self, name: str) -> subprocess.Popen[bytes]:
        out = open(self.log(name), "ab")
        try:
            return subprocess.Popen(self.command, env=self.env(name), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            raise ToolError(f"cannot run {self.command[0]!r}: {exc}") from exc
        finally:
            out.close()

    def wait(self, proc: subprocess.Popen[bytes], name: str, started: float) -> Dict[str, Any]:
        try:
            rc = proc.wait(timeout=max(1.0, self.timeout - (time.monotonic() - started)))
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            raise ToolError(f"the {name} run did not end within {self.timeout:g} s (--timeout); its output: "
                            f"{self.log(name)}") from None
        if rc != 0:
            raise ToolError(f"the {name} run failed with exit status {rc}:\n{_tail(self.log(name))}")
        return {"name": name, "returncode": rc, "seconds": round(time.monotonic() - started, 3)}

    def uninterrupted(self, name: str) -> Dict[str, Any]:
        started = time.monotonic()
        return self.wait(self.start(name), name, started)

    def killed(self, reference: Dict[report.Key, Dict[str, Any]]) -> Dict[str, Any]:
        """Kill the run inside an epoch once a checkpoint is committed, restart it, wait for the end."""
        name = "killed"
        started = time.monotonic()
        proc = self.start(name)
        victim: Optional[Dict[str, Any]] = None
        storage = open_storage(os.path.join(self.dir, f"ckpt-{name}"), StorageOptions())  # a local temporary directory
        committed: Set[str] = set()
        while proc.poll() is None:
            if time.monotonic() - started > self.timeout:
                _kill_group(proc)
                raise ToolError(f"the {name} run did not end within {self.timeout:g} s (--timeout)")
            records = report.read_records(self.digests(name))
            last = records[-1] if records else None
            if last is not None and last.get("kind") == "start":
                rng, epoch = last["range"], last["epoch"]
                if rng not in committed and _has_commit(storage, rng):
                    committed.add(rng)
                if rng in committed:
                    ref = reference.get((rng, epoch))
                    duration = float(ref.get("seconds", 0.0)) if ref else 0.0
                    if time.time() >= float(last.get("time", 0.0)) + duration / 2:
                        _kill_group(proc)
                        proc.wait()
                        victim = last
                        break
            time.sleep(_POLL)
        if victim is None:
            proc.wait()
            raise ToolError(
                "the run ended before it could be killed inside an epoch after a checkpoint was committed: give it "
                f"more epochs (--epochs, now {self.epochs}) or longer ones; its output: {self.log(name)}")
        self.say(f"killed (SIGKILL) in epoch {victim['epoch']} of range {victim['range']}; restarting")
        before = len(report.read_records(self.digests(name)))
        proc = self.start(name)
        res = self.wait(proc, name, started)
        after = report.read_records(self.digests(name))[before:]
        starts = [r for r in after if r.get("kind") == "start" and r["range"] == victim["range"]]
        res.update({"killed_in_epoch": victim["epoch"], "killed_in_range": victim["range"],
                    "resumed_at_epoch": starts[0]["epoch"] if starts else None})
        return res


def _has_commit(storage: Storage, range_name: str) -> bool:
    try:
        return any(i.committed for i in scan_range(storage, JOB, range_name, quiet_progress=True))
    except Exception:  # not there yet, or being written
        return False


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            proc.kill()
        except ProcessLookupError:
            pass


def _tail(path: str, n: int = 3000) -> str:
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError:
        return ""
    return data[-n:].decode("utf-8", "replace")


def check(command: List[str], epochs: int = 3, timeout: float = 600.0, quiet: bool = False,
          keep: bool = False) -> report.CheckResult:
    if not command:
        raise ToolError("no command to check: paddle-acp check -- python train.py ARGS")
    if epochs < 2:
        raise ToolError(f"--epochs {epochs}: at least 2 (a checkpoint must be committed before the kill)")
    workdir = tempfile.mkdtemp(prefix="paddle-acp-check-")
    runs = _Runs(command, epochs, timeout, workdir, quiet)
    try:
        runs.say(f"run 1/3 (uninterrupted, {epochs} epochs per range): {' '.join(command)}")
        first = runs.uninterrupted("reference")
        runs.say(f"run 1/3 took {first['seconds']:.1f} s; the check needs about {3.2 * first['seconds']:.0f} s "
                 "more (another run, a killed run and its restart)")
        ref = report.epochs_of(report.read_records(runs.digests("reference")))
        if not ref:
            raise ToolError("the command ran no epoch of a paddle-acp range (train_epoch_range, or Paddle's "
                            f"auto_checkpoint under `paddle-acp run`): nothing to compare. Its output:\n"
                            f"{_tail(runs.log('reference'))}")
        runs.say("run 2/3 (uninterrupted again)")
        second = runs.uninterrupted("repeat")
        rep = report.epochs_of(report.read_records(runs.digests("repeat")))
        diff = report.first_difference(ref, rep, "first", "second")
        if diff is not None:
            return report.CheckResult(command, epochs, report.NOT_DETERMINISTIC, [first, second], diff, [],
                                      report.uncaptured_objects(ref, rep), len(ref))
        runs.say("run 3/3 (killed inside an epoch after a checkpoint, then restarted)")
        third = runs.killed(ref)
        kil = report.epochs_of(report.read_records(runs.digests("killed")))
        diff = report.first_difference(ref, kil, "uninterrupted", "killed")
        verdict = report.RESUMES_EXACTLY if diff is None else report.RESUMES_DIFFERENTLY
        return report.CheckResult(command, epochs, verdict, [first, second, third], diff,
                                  report.differing_scalars(ref, rep, kil), report.uncaptured_objects(ref, rep, kil),
                                  len(ref))
    finally:
        if keep:
            runs.say(f"kept the runs' checkpoints, digests and output in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def register(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "check", help="run a training command three ways (twice uninterrupted, once killed and restarted) and say "
        "whether it resumes exactly (exit 0), is not deterministic (1) or resumes differently (2)",
        description="Run the command a few epochs (--epochs, every range cut short; the script is not edited) "
        "three ways, each checkpointing every epoch to a temporary directory: uninterrupted, uninterrupted again, "
        "and SIGKILLed inside an epoch after a checkpoint was committed, then restarted. Compare what paddle-acp "
        "sees at every epoch end (every registered persistable, the values the script fetched). Exit status 0: "
        "resumes exactly; 1: not deterministic even without a kill; 2: resumes differently; 3: could not check.")
    p.add_argument("--epochs", type=int, default=3, help="epochs per range in each run (default 3, at least 2)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds each run may take (default 600)")
    p.add_argument("--json", action="store_true", help="machine-readable report on stdout")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (checkpoints, digests, output)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the training command")
    return p


def main(args: argparse.Namespace) -> int:
    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    try:
        res = check(command, args.epochs, args.timeout, keep=args.keep)
    except ToolError as exc:
        print(f"paddle-acp check: error: {exc}", file=sys.stderr)
        return 3
    if args.json:
        emit_json(report.to_json(res))
    else:
        emit(report.render(res))
    return res.exit_status
