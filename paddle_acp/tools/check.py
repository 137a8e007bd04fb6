"""``paddle-acp check -- CMD ...``: does this training command resume exactly after a kill anywhere?

Runs the user's command unchanged (:mod:`.check_runs`): uninterrupted twice, then once per kill point, killed there and
restarted. The runtime SIGKILLs itself at that training position once the checkpoints before it are committed, so the
point is the same on any machine load; it appends what it sees at every epoch end to the digests files
(:mod:`paddle_acp.runtime.digests`), which :mod:`.check_report` compares. A command that cannot be checked exits with 3;
Ctrl-C or SIGTERM ends every process the check started and removes its directory (unless ``--keep``)."""

from __future__ import annotations

import argparse
import contextlib
import shutil
import signal
import sys
import tempfile
from typing import Any, Dict, List, Optional, Tuple

from paddle_acp.secrets import redact_command
from paddle_acp.tools import check_report as report
from paddle_acp.tools.check_runs import Point, Runs, strip_runner_options, tail
from paddle_acp.tools.discovery import ToolError
from paddle_acp.tools.render import output


class Interrupted(Exception):
    """SIGTERM or SIGHUP reached the check (Ctrl-C is a KeyboardInterrupt)."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"signal {signum}")
        self.signum = signum


def parse_kill_at(text: str) -> Tuple[int, Optional[int]]:
    """``EPOCH`` or ``EPOCH:STEP`` (--kill-at) -> (epoch, step or None); ToolError naming a bad one."""
    parts = text.strip().split(":")
    if not 1 <= len(parts) <= 2 or not all(p.isdigit() for p in parts):
        raise ToolError(f"--kill-at {text!r}: EPOCH or EPOCH:STEP (non-negative integers; STEP counts the "
                        "epoch's batches from 0), e.g. --kill-at 3 or --kill-at 1:4")
    return int(parts[0]), int(parts[1]) if len(parts) == 2 else None


def kill_points(records: List[Dict[str, Any]], asked: List[Tuple[int, Optional[int]]]) -> List[Point]:
    """Where to kill, from the first run's records (its lowest rank's): the points ``asked`` (--kill-at, in the first
    range that ran that epoch), else early, middle and last epochs and a batch after the first mid-epoch checkpoint."""
    seq = list(dict.fromkeys((r["range"], r["epoch"]) for r in records if r.get("kind") == "start"))
    points: List[Point] = []
    if asked:
        for epoch, step in asked:
            ranges = [r for r, e in seq if e == epoch]
            if not ranges:
                ran = ", ".join(f"{e} of {r}" for r, e in seq)
                raise ToolError(f"--kill-at {epoch}{'' if step is None else f':{step}'}: the first run never "
                                f"started epoch {epoch} (it ran epochs {ran}); raise --epochs or pick another")
            points.append((ranges[0], epoch, step))
    else:
        picks = [seq[1], seq[len(seq) // 2], seq[-1]] if len(seq) > 1 else seq[:1]
        points = [(r, e, None) for r, e in picks]
        saves = [r for r in records if r.get("kind") == "save" and isinstance(r.get("step"), int)]
        if saves:
            points.append((saves[0]["range"], saves[0]["epoch"], saves[0]["step"]))
    return list(dict.fromkeys(points))


def _on_signal(signum: int, frame: Any) -> None:
    raise Interrupted(signum)


def check(command: List[str], epochs: int = 3, timeout: float = 600.0, keep: bool = False,
          kill_at: Optional[List[Tuple[int, Optional[int]]]] = None) -> report.CheckResult:
    if not command:
        raise ToolError("no command to check: paddle-acp check -- python train.py ARGS")
    if epochs < 2:
        raise ToolError(f"--epochs {epochs}: at least 2 (a checkpoint must be committed before the kill)")

    def say(text: str) -> None:
        print(f"paddle-acp check: {text}", file=sys.stderr, flush=True)

    command, removed = strip_runner_options(command)
    notes = [f"removed {o} (and its value) from the paddle-acp run command: the check's runs checkpoint into its "
             "own temporary directory, never into the job's location, every epoch" for o in removed]
    for n in notes:
        say(n)
    workdir = tempfile.mkdtemp(prefix="paddle-acp-check-")
    runs = Runs(command, epochs, timeout, workdir, say)
    try:
        say(f"run 1 (uninterrupted, {epochs} epochs per range): {' '.join(redact_command(command))}")
        first = runs.uninterrupted("reference")
        ref_records = runs.records("reference")
        ref = report.rank_epochs(ref_records)
        if not any(ref.values()):
            raise ToolError("the command ran no epoch of a paddle-acp range (train_epoch_range, or Paddle's "
                            f"auto_checkpoint under `paddle-acp run`): nothing to compare. Its output:\n"
                            f"{tail(runs.log('reference'))}")
        points = kill_points(ref_records[min(ref_records)], kill_at or [])
        total = 2 + len(points)
        say(f"run 1/{total} took {first['seconds']:.1f} s; the check needs about "
            f"{(1 + 2.2 * len(points)) * first['seconds']:.0f} s more (another run, then for each of "
            f"{len(points)} kill points a killed run and its restart)")
        say(f"run 2/{total} (uninterrupted again)")
        second = runs.uninterrupted("repeat")
        rep = report.rank_epochs(runs.records("repeat"))
        compared = sum(len(e) for e in ref.values())
        diff = report.first_rank_difference(ref, rep, "first", "second")
        if diff is not None:
            return report.CheckResult(command, epochs, report.NOT_DETERMINISTIC, [first, second], diff, [],
                                      report.uncaptured_objects(ref, rep), compared, notes=notes)
        done: List[Dict[str, Any]] = [first, second]
        kills: List[Dict[str, Any]] = []
        killed_runs: List[report.RankEpochs] = []
        scalars: Dict[Tuple[int, str], Dict[str, Any]] = {}
        for i, point in enumerate(points):
            name = f"killed-{i + 1}"
            where = report.point_text({"range": point[0], "epoch": point[1], "step": point[2]})
            say(f"run {3 + i}/{total} (SIGKILL at {where}, then a restart)")
            res = runs.killed(name, point)
            done.append(res)
            kil = report.rank_epochs(runs.records(name))
            killed_runs.append(kil)
            diff = report.first_rank_difference(ref, kil, "uninterrupted", "killed")
            for s in report.differing_scalars(ref, rep, kil):
                scalars.setdefault((s["rank"], s["name"]), s)
            kills.append({**res["killed_at"], "run": name, "resumed_at_epoch": res["resumed_at_epoch"],
                          "resumed_mid_epoch": res["resumed_mid_epoch"], "identical": diff is None})
            if diff is not None:
                break
        uncaptured = report.uncaptured_objects(ref, rep, *killed_runs)
        if diff is not None:
            verdict = report.RESUMES_DIFFERENTLY
        elif scalars or uncaptured:
            verdict = report.STATE_NOT_RESTORED
        else:
            verdict = report.RESUMES_EXACTLY
        return report.CheckResult(command, epochs, verdict, done, diff, list(scalars.values()), uncaptured, compared,
                                  kills, notes)
    finally:
        runs.end_all()
        if keep:
            say(f"kept the runs' checkpoints, digests and output in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def register(sub: Any) -> argparse.ArgumentParser:
    p: argparse.ArgumentParser = sub.add_parser(
        "check", help="run a training command uninterrupted and killed at several points, and say whether it "
        "resumes exactly (exit 0), is not deterministic (1), resumes differently (2) or resets state (4)",
        description="Run the command a few epochs (--epochs, every range cut short; the script is not edited), "
        "each run checkpointing every epoch to a temporary directory: twice uninterrupted, then once per kill "
        "point SIGKILLed there (early, middle and last epochs, a batch after a mid-epoch checkpoint; or "
        "--kill-at) and restarted. Compare what paddle-acp sees at every epoch end on every rank (every "
        "registered persistable, the values the script fetched, the script's numbers). Exit status 0: resumes "
        "exactly; 1: not deterministic even without a kill; 2: resumes differently; 3: could not check; "
        "4: the restart reset state of the script that paddle-acp does not capture.")
    p.add_argument("--epochs", type=int, default=3, help="epochs per range in each run (default 3, at least 2)")
    p.add_argument("--kill-at", action="append", default=[], metavar="EPOCH[:STEP]",
                   help="kill inside this epoch (after its first batch; with STEP in batch STEP, from 0) of the "
                   "first range that runs it; repeatable (default: early, middle and last epochs, and a batch "
                   "after the first mid-epoch checkpoint)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds each run may take (default 600)")
    p.add_argument("--json", action="store_true", help="machine-readable report on stdout")
    p.add_argument("--keep", action="store_true", help="keep the temporary directory (checkpoints, digests, output)")
    p.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...", help="the training command")
    return p


def main(args: argparse.Namespace) -> int:
    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    previous: Dict[int, Any] = {}
    for num in (int(signal.SIGTERM), int(signal.SIGHUP)):
        with contextlib.suppress(ValueError):  # not the main thread: the caller handles its signals
            previous[num] = signal.signal(num, _on_signal)
    try:
        points = [parse_kill_at(k) for k in args.kill_at]
        res = check(command, args.epochs, args.timeout, keep=args.keep, kill_at=points)
    except ToolError as exc:
        print(f"paddle-acp check: error: {exc}", file=sys.stderr)
        return 3
    except (KeyboardInterrupt, Interrupted) as exc:
        got = exc.signum if isinstance(exc, Interrupted) else int(signal.SIGINT)
        print(f"paddle-acp check: interrupted (signal {got}): every process it started was ended"
              + ("" if args.keep else ", its temporary directory removed"), file=sys.stderr)
        return 128 + got
    finally:
        for num, handler in previous.items():
            signal.signal(num, handler)
    return output(res, args.json, report.to_json, report.render).exit_status
