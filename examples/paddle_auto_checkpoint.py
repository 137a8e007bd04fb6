"""A script written for Paddle's own auto-checkpoint API, unchanged, run under paddle-acp's runner.

    paddle-acp run --checkpoint /tmp/acp-ckpt --interval 0 examples/paddle_auto_checkpoint.py

The runner installs the Executor.run hook and makes ``paddle.incubate.checkpoint.auto_checkpoint``
resolve to paddle-acp, so ``train_epoch_range`` saves and resumes as Paddle's documentation describes
(Paddle's own hook never runs on Paddle 2.6.2 to 3.3). Run directly with ``python``, it trains without
checkpoints, as it would on plain Paddle.

What this run does: 5 epochs (``--epochs``) of 8 batches; with ``--interval 0`` a checkpoint after every
epoch, each one taken (Paddle's API waits for the previous checkpoint rather than skip a due one, unless
``PADDLE_ACP_BUSY_POLICY`` says otherwise). A kill loses the epoch in progress, and also the one before it
when it lands while that epoch's checkpoint is still being written; the rerun of the same command says
where it resumes.
"""
import argparse

import numpy as np
import paddle
from paddle.incubate.checkpoint import auto_checkpoint as acp

paddle.enable_static()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--params-out", default=None, help="write the final parameters here (.npz)")
    a = ap.parse_args()
    paddle.seed(0)
    np.random.seed(0)
    main_prog, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main_prog, startup):
        x = paddle.static.data("x", [None, 4], "float32")
        y = paddle.static.data("y", [None, 1], "float32")
        loss = paddle.mean(paddle.square(paddle.static.nn.fc(x, 1) - y))
        paddle.optimizer.SGD(learning_rate=0.05).minimize(loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    for epoch in acp.train_epoch_range(a.epochs):
        for _ in range(8):
            xb = np.random.randn(16, 4).astype("float32")
            (lv,) = exe.run(main_prog, feed={"x": xb, "y": xb.sum(axis=1, keepdims=True)}, fetch_list=[loss])
        print(f"epoch {epoch}: loss {float(lv):.6f}", flush=True)
    if a.params_out:
        scope = paddle.static.global_scope()
        names = [p.name for p in main_prog.global_block().all_parameters()]
        np.savez(a.params_out, **{n: np.array(scope.find_var(n).get_tensor()) for n in names})


if __name__ == "__main__":
    main()
