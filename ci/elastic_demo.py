#!/usr/bin/env python3
"""Demo: elastic training under Paddle's launcher; a trainer is SIGKILLed, the job restarts and resumes.

1. starts a real etcd on 127.0.0.1 (tests/support/etcd.py; installs Debian's etcd-server
   and PyPI etcd3 if missing);
2. runs ``tests/scripts/elastic_train.py`` once alone without paddle-acp (the
   reference);
3. launches it as an elastic job with paddle-acp on::

       PADDLE_JOB_ID=<job> PADDLE_ACP_CHECKPOINT_URI=<dir> \\
       PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION=python \\
       python -m paddle.distributed.launch --master etcd://127.0.0.1:PORT \\
           --nnodes 1 --nproc_per_node 2 --elastic_level 1 --max_restart 3 train.py

   (``--nnodes 2``: two launcher processes with one trainer each);
4. SIGKILLs trainer 1 from outside in the middle of epoch ``--kill-epoch``;
   the launcher stops trainer 0 (SIGTERM: paddle-acp saves, exit 143) and
   restarts the pod; both trainers resume from trainer 0's last checkpoint;
5. prints each trainer's incarnations and checks the final parameters
   against the reference, bit for bit.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))  # the test helpers: tests/support
from support import etcd  # noqa: E402

SCRIPT = str(ROOT / "tests" / "scripts" / "elastic_train.py")


def say(msg):
    print(f"[elastic-demo] {msg}", flush=True)


def events(out, rank):
    p = Path(out) / f"events.r{rank}.jsonl"
    return [json.loads(x) for x in p.read_text().splitlines() if x.strip()] if p.exists() else []


def trainer_env():
    env = {k: v for k, v in os.environ.items() if k not in etcd.LAUNCHER_VARS and not k.startswith("PADDLE_ACP_")}
    env.update(PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", GLOG_minloglevel="2")
    return env


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nnodes", type=int, choices=[1, 2], default=1,
                    help="1: one launcher with 2 trainers; 2: two launchers with one trainer each")
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--kill-epoch", type=int, default=2)
    ap.add_argument("--job-id", default="elastic-demo")
    ap.add_argument("--workdir", default=None, help="keep everything here (default: a temporary dir, removed)")
    args = ap.parse_args(argv)

    work = Path(args.workdir or tempfile.mkdtemp(prefix="acp-elastic-demo-"))
    if args.workdir:
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
    out, ckpt = work / "out", work / "ckpt"
    train_args = ["--out", out, "--epochs", args.epochs, "--steps", args.steps, "--sleep", 0.1]
    group = None
    srv = None
    try:
        try:
            etcd.find_etcd()
            etcd.ensure_etcd3()
            srv = etcd.EtcdServer(log_path=str(work / "etcd.log")).start()
        except etcd.EtcdUnavailable as exc:
            say(f"cannot run: {exc}")
            return 2
        say(f"etcd pid {srv.pid} at {srv.client_url}")

        say("reference: one trainer, uninterrupted, paddle-acp off")
        ref_out = work / "reference"
        subprocess.run([sys.executable, SCRIPT, "--out", str(ref_out), "--no-barrier", "--epochs", str(args.epochs),
                        "--steps", str(args.steps), "--sleep", "0"], env=trainer_env(), check=True,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

        env = etcd.launcher_env(args.job_id, base=trainer_env(), PADDLE_ACP_CHECKPOINT_URI=str(ckpt))
        group = etcd.LaunchGroup(work, env, relaunch=1)
        nodes = [(1, 2, None)] if args.nnodes == 1 else [(2, 1, 0), (2, 1, 1)]
        for i, (nnodes, nproc, rank) in enumerate(nodes):
            cmd = etcd.launch_command(srv.master_url, SCRIPT, train_args, nnodes=nnodes, nproc_per_node=nproc,
                                      rank=rank, max_restart=3, log_dir=str(work / f"log.node{i}"))
            say(f"launcher {i}: PADDLE_JOB_ID={args.job_id} PADDLE_ACP_CHECKPOINT_URI={ckpt} "
                + " ".join(f"{k}={v}" for k, v in etcd.LAUNCHER_ENV.items()) + " " + " ".join(cmd[1:]))
            group.add(f"node{i}", cmd)

        # kill trainer 1 once it is inside epoch --kill-epoch
        deadline = time.monotonic() + 120
        victim = None
        while time.monotonic() < deadline and victim is None:
            if any(e["event"] == "epoch" and e["epoch"] == args.kill_epoch - 1 for e in events(out, 1)):
                time.sleep(0.25)
                lines = (out / "pids").read_text().split("\n")
                victim = [int(x.split()[0]) for x in lines if x.strip() and x.split()[1] == "1"][-1]
            elif group.poll() is not None:
                break
            time.sleep(0.05)
        if victim is None:
            say("trainer 1 never reached the epoch to kill; launcher output follows")
            for name in group.nodes:
                print(group.log_text(name)[-3000:])
            return 1
        say(f"SIGKILL trainer 1 (pid {victim}) inside epoch {args.kill_epoch}")
        os.kill(victim, signal.SIGKILL)
        t_kill = time.monotonic()

        codes = group.wait(180)
        say(f"launchers exited {codes}, {time.monotonic() - t_kill:.1f} s after the kill")
        if group.relaunched:
            say(f"relaunched (Paddle launcher race, see tests/support/etcd.py LaunchGroup): {group.relaunched}")
        for name in group.nodes:
            for line in group.log_text(name).splitlines():
                if any(k in line for k in ("Run Pod", "Pod failed", "Pod completed", "Exit code")):
                    print(f"    {name} | {line.strip()}")
        ok = codes is not None and all(c == 0 for c in codes.values())
        with np.load(ref_out / "final.r0.npz") as d:
            ref = {k: d[k] for k in d.files}
        for r in (0, 1):
            say(f"trainer {r}:")
            for e in events(out, r):
                if e["event"] == "start":
                    src = "scratch" if e["restored"] is None else f"checkpoint {e['restored']}"
                    print(f"    pid {e['pid']}: starts at epoch {e['epoch']} step {e['step']} from {src}"
                          f"  (PADDLE_TRAINER_ID={e['env']['PADDLE_TRAINER_ID']}, "
                          f"PADDLE_JOB_ID={e['env']['PADDLE_JOB_ID']})")
                elif e["event"] == "epoch":
                    print(f"        epoch {e['epoch']} done" + (f" (from step {e['first_step']})"
                                                                  if e["first_step"] else ""))
                elif e["event"] == "exit":
                    print(f"        exit {e['code']} (SIGTERM from the launcher: saved first)")
            final = out / f"final.r{r}.npz"
            if not final.exists():
                ok = False
                say(f"trainer {r} did not finish")
                continue
            with np.load(final) as d:
                same = sorted(d.files) == sorted(ref) and all(np.array_equal(d[k], ref[k]) for k in ref)
            say(f"trainer {r} final parameters {'==' if same else '!='} uninterrupted run's")
            ok = ok and same
        files = sorted(str(p.relative_to(ckpt)) for p in ckpt.rglob("*") if p.is_file())
        say(f"checkpoints (written by trainer 0 only): {files}")
        say("OK" if ok else "FAILED")
        return 0 if ok else 1
    finally:
        if group is not None:
            group.close()
        pids = out / "pids"
        if pids.exists():
            for line in pids.read_text().splitlines():
                pid = int(line.split()[0])
                try:
                    if b"elastic_train.py" in Path(f"/proc/{pid}/cmdline").read_bytes():
                        os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
        if srv is not None:
            srv.stop()
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)
        else:
            say(f"everything is in {work}")


if __name__ == "__main__":
    sys.exit(main())
