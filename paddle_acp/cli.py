"""Command line: ``paddle-acp run`` and the operator tools (:mod:`paddle_acp.tools`); only ``run`` imports Paddle."""

from __future__ import annotations

import argparse
import logging
import os
import runpy
import sys
from typing import Any, List, Optional

from paddle_acp import config as _config
from paddle_acp.errors import AcpError, ConfigError

logger = logging.getLogger("paddle_acp")

_PADDLE_MODULES = {
    "paddle.base.incubate.checkpoint.auto_checkpoint": "auto_checkpoint",
    "paddle.incubate.checkpoint.auto_checkpoint": "auto_checkpoint",
    "paddle.base.incubate.checkpoint.checkpoint_saver": "checkpoint_saver",
}


def redirect_paddle_auto_checkpoint() -> None:
    """Make Paddle's auto_checkpoint (and checkpoint_saver) module names resolve to ours (after the gate)."""
    import importlib

    from paddle_acp.compat import auto_checkpoint, checkpoint_saver

    ours = {"auto_checkpoint": auto_checkpoint, "checkpoint_saver": checkpoint_saver}
    for name, which in _PADDLE_MODULES.items():
        parent_name, _, leaf = name.rpartition(".")
        try:
            parent = importlib.import_module(parent_name)
        except ImportError:
            continue
        setattr(parent, leaf, ours[which])
        sys.modules[name] = ours[which]
    coll: Any = sys.modules.get("paddle.incubate.distributed.fleet.collective")
    if coll is not None:  # fleet imported Paddle's saver names directly
        coll.CheckpointSaver, coll.PaddleModel = checkpoint_saver.CheckpointSaver, checkpoint_saver.PaddleModel


def _cmd_run(args: argparse.Namespace) -> int:
    if _config.check_digests_from_env() is not None:  # under `paddle-acp check`: its runs keep its location
        options = (("--checkpoint", args.checkpoint), ("--interval", args.interval), ("--job-id", args.job_id))
        for option, value in options:
            if value is not None:
                logger.warning("paddle-acp run: %s ignored under paddle-acp check (its runs checkpoint into its own "
                               "temporary directory, every epoch, never into the job's location)", option)
        args.checkpoint = args.interval = args.job_id = None
    if args.checkpoint is not None:
        if args.checkpoint.strip() == "":
            raise ConfigError(f"--checkpoint={args.checkpoint!r} is empty: give where to checkpoint "
                              "(a local path, or a file://, hdfs:// or s3:// URI), or leave the option out")
        os.environ["PADDLE_ACP_CHECKPOINT_URI"] = args.checkpoint
    if args.interval is not None:
        _config.check_interval(args.interval, "--interval")
        os.environ["PADDLE_ACP_SAVE_INTERVAL"] = str(args.interval)
    if args.job_id is not None:
        _config.validate_job_id(args.job_id, "--job-id")
        os.environ["PADDLE_JOB_ID"] = args.job_id
    _config.from_env()  # fail early, naming the variable, on a bad configuration
    if not os.path.isfile(args.script):
        raise AcpError(f"script {args.script!r} does not exist")
    import paddle_acp

    paddle_acp._activate()  # no or an unsupported Paddle: one UnsupportedPaddleError line, exit status 2
    redirect_paddle_auto_checkpoint()
    sys.argv = [args.script] + list(args.args)
    sys.path.insert(0, os.path.dirname(os.path.abspath(args.script)))
    runpy.run_path(args.script, run_name="__main__")
    from paddle_acp.runtime.api import final_save_failures

    if final_save_failures:  # logged already; the exit status says it too
        print(f"paddle-acp: error: {final_save_failures[-1]}", file=sys.stderr)
        return 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="paddle-acp", description="Automatic checkpoints for PaddlePaddle training.")
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser(
        "run", help="run a training script with auto-checkpointing (Paddle's auto_checkpoint API works unchanged)"
    )
    r.add_argument("--checkpoint", metavar="URI", help="where to checkpoint (sets PADDLE_ACP_CHECKPOINT_URI)")
    r.add_argument("--interval", metavar="SECONDS", type=float, help="seconds between checkpoints (0 = every epoch)")
    r.add_argument("--job-id", help="job id (sets PADDLE_JOB_ID)")
    r.add_argument("script")
    r.add_argument("args", nargs=argparse.REMAINDER)
    r.set_defaults(func=_cmd_run)
    from paddle_acp import tools

    tools.add_subcommands(sub)
    return p


def main(argv: Optional[List[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _config.log_level_from_env()  # the package leaves a bad value to us when the gate is deferred
        rc: int = args.func(args)  # _cmd_run or a tool's main, wrapped by tools.render.guard
        return rc
    except AcpError as exc:
        from paddle_acp.storage.base import scrub

        print(f"paddle-acp: error: {scrub(exc)}", file=sys.stderr)
        return 2
