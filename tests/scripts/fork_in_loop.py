#!/usr/bin/env python
"""A script that forks a child inside its training loop (tests/e2e/test_fork_in_loop.py).

At the end of epoch 1's step the script forks; the child leaves the loop by returning from the function
that holds it (the loop's generator is closed in the child, as a forked helper process that returns
would) and exits with ``os._exit`` (Paddle's executor segfaults in its destructor at a forked child's
interpreter exit). Every log line carries its process id, so the test tells the child's lines apart.
"""
import logging
import os

logging.basicConfig(level=logging.INFO, format="pid=%(process)d %(message)s")  # before Paddle's import

import numpy as np  # noqa: E402
import paddle  # noqa: E402

import paddle_acp as acp  # noqa: E402

paddle.enable_static()
main, start = paddle.static.Program(), paddle.static.Program()
with paddle.static.program_guard(main, start):
    x = paddle.static.data("x", [4, 2], "float32")
    loss = paddle.mean(paddle.static.nn.fc(x, 1))
    paddle.optimizer.SGD(0.1).minimize(loss)
exe = paddle.static.Executor()
exe.run(start)


def train():
    for epoch in acp.train_epoch_range(3, 0):
        exe.run(main, feed={"x": np.ones((4, 2), "float32")}, fetch_list=[loss])
        if epoch == 1:
            pid = os.fork()
            if pid == 0:
                return "child"
            _, status = os.waitpid(pid, 0)
            logging.info("child status %d", status)
    return "parent"


if train() == "child":
    logging.info("child left the loop")
    logging.shutdown()
    os._exit(0)
logging.info("parent done")
