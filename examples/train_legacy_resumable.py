"""Mid-epoch checkpoints and resume with ``acp.resumable`` (legacy IR; the same works under PIR).

    PADDLE_ACP_CHECKPOINT_URI=/tmp/acp-ckpt PADDLE_JOB_ID=example-steps python examples/train_legacy_resumable.py

What this run does: 4 epochs (``--epochs``) of 12 batches. ``acp.resumable(batches, save_every_steps=5)``
counts the batches of an epoch and takes a checkpoint after batches 5 and 10, and ``save_checkpoint_inter=0``
one at every epoch end; each one is taken (under the default busy policy, ``auto``, a checkpoint that
comes due while the previous one is still being written waits for it: milliseconds here). After a restart
it skips the batches the checkpoint already covers. A kill loses the batches since the last committed
checkpoint: at most 5, or at most 10 when it lands while the newest checkpoint is still being written (its
persist takes milliseconds on a local disk). A SIGTERM (a preemption) saves at the next batch and exits,
losing nothing.
"""
import os

os.environ.setdefault("FLAGS_enable_pir_api", "0")  # legacy IR: must be set before Paddle is imported

import argparse  # noqa: E402

import numpy as np  # noqa: E402
import paddle  # noqa: E402

import paddle_acp as acp  # noqa: E402

IN_DIM, BATCH, STEPS = 8, 16, 12


def batches(epoch):
    """A deterministic loader: the same batches for the same epoch, however often it is iterated."""
    rs = np.random.RandomState(epoch)
    for _ in range(STEPS):
        xb = rs.randn(BATCH, IN_DIM).astype("float32")
        yield {"x": xb, "y": xb.sum(axis=1, keepdims=True)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=4)
    ap.add_argument("--params-out", default=None, help="write the final parameters here (.npz)")
    a = ap.parse_args()
    paddle.enable_static()
    paddle.seed(0)
    main_prog, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main_prog, startup):
        x = paddle.static.data("x", [None, IN_DIM], "float32")
        y = paddle.static.data("y", [None, 1], "float32")
        loss = paddle.mean(paddle.square(paddle.static.nn.fc(x, 1) - y))
        paddle.optimizer.Momentum(learning_rate=0.01, momentum=0.9).minimize(loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)

    for epoch in acp.train_epoch_range(a.epochs, save_checkpoint_inter=0):
        for feed in acp.resumable(batches(epoch), save_every_steps=5):
            (lv,) = exe.run(main_prog, feed=feed, fetch_list=[loss])
        print(f"epoch {epoch}: loss {float(lv):.6f}", flush=True)

    if a.params_out:
        scope = paddle.static.global_scope()
        names = [p.name for p in main_prog.global_block().all_parameters()]
        np.savez(a.params_out, **{n: np.array(scope.find_var(n).get_tensor()) for n in names})


if __name__ == "__main__":
    main()
