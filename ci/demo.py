"""Demo: a real Paddle training run is SIGKILLed mid-way, restarted, and resumes.

Runs tests/scripts/train_script.py (Adam + StepDecay + dropout, eval every
epoch) three times: once uninterrupted without checkpointing (the reference),
then with PADDLE_ACP_CHECKPOINT_URI set: killed with SIGKILL partway through
epoch ``--kill-after``, restarted with the same command, and checked against
the reference bit for bit.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "tests", "scripts", "train_script.py")


def run(out, env, args, kill_after_epochs=None):
    cmd = [sys.executable, SCRIPT, "--out", out] + args
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if kill_after_epochs is None:
        text, _ = proc.communicate()
        return proc.returncode, text
    losses = os.path.join(out, "losses.jsonl")
    while proc.poll() is None:
        n = sum(1 for _ in open(losses)) if os.path.exists(losses) else 0
        if n >= kill_after_epochs:
            time.sleep(0.15)  # somewhere inside the next epoch
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    text, _ = proc.communicate()
    return proc.returncode, text


def last_losses(out):
    rows = {}
    for line in open(os.path.join(out, "losses.jsonl")):
        r = json.loads(line)
        rows[(r["range"], r["epoch"])] = (r["train_loss"], r["eval_loss"])
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--kill-after", type=int, default=3, help="kill once this many epochs finished")
    ap.add_argument("--ir", choices=["pir", "legacy"], default="pir")
    ap.add_argument("--workdir", default=None, help="keep files here (default: a temporary directory)")
    a = ap.parse_args()
    work = a.workdir or tempfile.mkdtemp(prefix="paddle-acp-demo-")
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    env = dict(os.environ)
    env.pop("PADDLE_ACP_CHECKPOINT_URI", None)
    if a.ir == "legacy":
        env["FLAGS_enable_pir_api"] = "0"
    args = ["--epochs", str(a.epochs), "--steps-per-epoch", "20", "--sleep", "0.02"]

    print(f"[demo] reference run without checkpointing ({a.ir})", flush=True)
    ref = os.path.join(work, "reference")
    rc, text = run(ref, env, args)
    if rc != 0:
        print(text)
        return 1

    ckpt = os.path.join(work, "checkpoints")
    out = os.path.join(work, "run")
    env["PADDLE_ACP_CHECKPOINT_URI"] = ckpt
    env["PADDLE_JOB_ID"] = "demo"
    print(f"[demo] training with checkpoints in {ckpt}; SIGKILL after {a.kill_after} epochs", flush=True)
    rc, text = run(out, env, args, kill_after_epochs=a.kill_after)
    print(f"[demo] first run ended with {'SIGKILL' if rc == -signal.SIGKILL else rc}", flush=True)
    print("[demo] restarting the same command", flush=True)
    rc, text = run(out, env, args)
    resumed = [line for line in text.splitlines() if "resum" in line.lower()]
    for line in resumed:
        print(f"[demo]   {line.strip()}")
    if rc != 0:
        print(text)
        return 1

    same_losses = last_losses(out) == last_losses(ref)
    a_params, b_params = np.load(os.path.join(out, "final.npz")), np.load(os.path.join(ref, "final.npz"))
    same_params = sorted(a_params.files) == sorted(b_params.files) and all(
        np.array_equal(a_params[k], b_params[k]) for k in a_params.files
    )
    print(f"[demo] per-epoch losses equal to the uninterrupted run: {same_losses}")
    print(f"[demo] final parameters bit-identical to the uninterrupted run: {same_params}")
    print(f"[demo] files kept in {work}")
    return 0 if (same_losses and same_params and resumed) else 1


if __name__ == "__main__":
    sys.exit(main())
