"""A complete static-graph training script that resumes exactly after a kill (PIR, Paddle 3.x's default IR).

    PADDLE_ACP_CHECKPOINT_URI=/tmp/acp-ckpt PADDLE_JOB_ID=example-pir python examples/train_pir.py

What this run does: 6 epochs (``--epochs``) of 10 batches; a checkpoint after every epoch
(``save_checkpoint_inter=0``), each one taken: under the default busy policy (``auto``) an epoch end that
finds the previous checkpoint still being written waits for it (milliseconds for this 8 KB state; a
checkpoint is skipped only when such waits would pass 5% of the run's time beyond its first 2 s, and the
log then says so). Kill it at any moment (``kill -9``, Ctrl-C, a preempted node) and run the same command
again: it says where it resumes (or that no checkpoint was committed yet and it starts at epoch 0) and
ends with the same parameters, bit for bit, as a run that was never interrupted. A kill loses the epoch in
progress, and also the one before it when it lands while that epoch's checkpoint is still being written.
Without ``PADDLE_ACP_CHECKPOINT_URI`` the loop is a plain ``range``.
"""
import argparse

import numpy as np
import paddle

import paddle_acp as acp  # importing installs the Executor.run hook

IN_DIM, HIDDEN, BATCH, STEPS = 16, 32, 8, 10


def build():
    """The training program, its evaluation clone and the LR scheduler."""
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [None, IN_DIM], "float32")
        y = paddle.static.data("y", [None, 1], "float32")
        h = paddle.nn.functional.relu(paddle.static.nn.fc(x, HIDDEN))
        h = paddle.nn.functional.dropout(h, p=0.2, training=True)  # draws from Paddle's RNG: saved too
        loss = paddle.mean(paddle.square(paddle.static.nn.fc(h, 1) - y))
        # PIR's Program.clone has no for_test: clone before minimize and map the loss into the clone
        mapping = paddle.pir.IrMapping()
        eval_program = main.clone(mapping)
        eval_loss = mapping.look_up(loss)
        sched = paddle.optimizer.lr.StepDecay(learning_rate=0.01, step_size=2, gamma=0.5)
        paddle.optimizer.Adam(learning_rate=sched).minimize(loss)
    return main, startup, eval_program, loss, eval_loss, sched


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=6)
    ap.add_argument("--params-out", default=None, help="write the final parameters here (.npz)")
    a = ap.parse_args()
    paddle.enable_static()
    paddle.seed(0)
    np.random.seed(0)  # NumPy's global RNG is saved with every checkpoint
    true_w = np.random.randn(IN_DIM, 1).astype("float32")
    main_prog, startup, eval_prog, loss, eval_loss, sched = build()
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)

    # save_checkpoint_inter=0: a checkpoint after every epoch (default: every 900 s, and after the last epoch)
    for epoch in acp.train_epoch_range(a.epochs, save_checkpoint_inter=0):
        for _ in range(STEPS):
            xb = np.random.randn(BATCH, IN_DIM).astype("float32")
            (train_loss,) = exe.run(main_prog, feed={"x": xb, "y": xb @ true_w}, fetch_list=[loss])
        sched.step()
        xe = np.random.randn(64, IN_DIM).astype("float32")
        (ev,) = exe.run(eval_prog, feed={"x": xe, "y": xe @ true_w}, fetch_list=[eval_loss])
        print(f"epoch {epoch}: train loss {float(train_loss):.6f}, eval loss {float(ev):.6f}", flush=True)

    if a.params_out:
        scope = paddle.static.global_scope()
        names = [p.name for p in main_prog.global_block().all_parameters()]
        np.savez(a.params_out, **{n: np.array(scope.find_var(n).get_tensor()) for n in names})


if __name__ == "__main__":
    main()
