#!/usr/bin/env python
"""Forked children of a process whose import opened HDFS early (tests/integration/test_fork_hdfs.py).

Run with ``PADDLE_ACP_CHECKPOINT_URI`` on HDFS: the import starts the early connection
(paddle_acp.runtime.early); before the loop the script forks a ``multiprocessing.Pool``, Paddle's
DataLoader workers (``num_workers=2``) and a raw ``os.fork`` child that exits through the interpreter's
exit (atexit handlers, finalizers); inside the loop (the range's own storage open, a save in flight) a raw
fork child that tries the parent's storage (it must be refused, not hang) and a Pool again. Prints one
JSON line of what it saw. ``FORK_AFTER_CONNECT=1``: the forks wait until the connection is made (the child
inherits a connected client; otherwise it may inherit one being made). ``NO_LOOP=1``: no training loop. ``DROPPED=1``: at the end, a fork after a storage was opened and dropped.
"""
import json
import multiprocessing as mp
import os
import sys

import numpy as np
import paddle

import paddle_acp as acp
from paddle_acp.errors import StorageError
from paddle_acp.runtime import early

out = {}
started = early._started
if os.environ.get("FORK_AFTER_CONNECT") == "1":
    started.thread.join()
    out["early"] = started.storage is not None


def square(x):
    return x * x


class Data(paddle.io.Dataset):
    def __len__(self):
        return 8

    def __getitem__(self, i):
        return np.full([2], i, "float32")


def fork_exit(body, interpreter_exit=True):
    """A raw fork whose child runs ``body`` and exits through the interpreter's exit (atexit handlers,
    finalizers) or ``os._exit`` (after Paddle's executor ran: its destructor crashes in a forked child,
    Paddle's own); the child's exit status."""
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            body()
        except BaseException as exc:  # reported through the status
            print(f"child: {type(exc).__name__}: {exc}", file=sys.stderr)
            code = 3
        if interpreter_exit:
            sys.exit(code)
        sys.stderr.flush()
        os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def pool_map():
    """A fork Pool's results, the Pool ended as a script should end it: ``close`` and ``join`` (its context
    manager's ``terminate`` SIGTERMs the workers, and Paddle's fatal-signal handler, which they inherit,
    can deadlock in a worker that was inside malloc then: Paddle's, not the storage's)."""
    pool = mp.get_context("fork").Pool(2)
    try:
        return pool.map(square, range(4))
    finally:
        pool.close()
        pool.join()


def use_the_parents_storage():
    try:
        acp.active_range().storage.exists("anything")
    except StorageError as exc:
        if "is a fork of it" not in str(exc):
            raise
        return
    raise AssertionError("the parent's client was used in the child")


out["pool"] = pool_map()
loader = paddle.io.DataLoader(Data(), batch_size=4, num_workers=2)
out["loader"] = [float(b.numpy().sum()) for b in loader]
out["fork"] = fork_exit(lambda: None)

if os.environ.get("NO_LOOP") != "1":
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [None, 4], "float32")
        loss = paddle.mean(paddle.static.nn.fc(x, 4))
        paddle.optimizer.SGD(0.1).minimize(loss)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    for epoch in acp.train_epoch_range(2, save_checkpoint_inter=0):
        exe.run(main, feed={"x": np.ones((2, 4), "float32")}, fetch_list=[loss])
        if epoch == 1:  # epoch 0's save in flight, the range's own storage open
            out["same"] = started is not None and acp.active_range().storage is started.storage
            out["in_loop_fork"] = fork_exit(use_the_parents_storage, interpreter_exit=False)
            out["in_loop_pool"] = pool_map()
if os.environ.get("DROPPED") == "1":
    # a storage opened and then dropped (an ended range's, a tool's): a later fork must not take any of its client
    # down with it in the child (hdfs-native: fsspec's own fork hook emptied its instance cache in the child, and
    # a client only that cache still held was dropped there, waiting forever for its runtime's threads)
    import gc

    from paddle_acp.storage.schemes import open_storage

    st = open_storage(os.environ["PADDLE_ACP_CHECKPOINT_URI"] + "-dropped")
    st.exists("anything")
    del st
    gc.collect()
    out["after_dropped"] = fork_exit(lambda: None, interpreter_exit=False)
print(json.dumps(out), flush=True)
