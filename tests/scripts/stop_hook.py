"""Test hook: a training process stops itself (SIGSTOP) once, at a named point of the library.

``ACP_TEST_STOP="<point>:<file>"`` (read by the test scripts only, never by the library):
at the first call of the point the process creates ``<file>`` and stops; the test sends
SIGCONT. When that call returns or raises, ``<file>.done`` is created, so the test knows
what the resumed process did there is over. Points:

* ``save``: the start of ``GlobalCheckpointer.save`` (a save of this rank, one process's too: before any storage call);
* ``write``: the start of the data write of a save (a single writer's checkpoint, or a rank's
  part once its save decided to write it: its temporary directory exists where the storage
  needs one made first; nothing is committed);
* ``remove_own``: the start of ``GlobalCheckpointer._remove_own`` (a rank removing its earlier
  part at a position, before it lists: at start, or a save at a position it was at before).

``<point>@<n>`` stops at the n-th call of the point instead of the first.
"""
import functools
import os
import signal
import threading


def install():
    spec = os.environ.get("ACP_TEST_STOP")
    if not spec:
        return
    point, path = spec.split(":", 1)
    point, _, nth = point.partition("@")
    calls = []
    fired = []

    def wrap(owner, attr):
        orig = getattr(owner, attr)

        @functools.wraps(orig)
        def hooked(*args, **kwargs):
            calls.append(True)
            if fired or len(calls) < int(nth or 1):
                return orig(*args, **kwargs)
            fired.append(True)
            with open(path, "w") as f:
                f.write("%d\n" % os.getpid())
            # to this very thread: os.kill(pid) wakes the main thread to stop the process, and this one
            # could run on for a while (creating directories) before it stops too
            signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
            try:
                return orig(*args, **kwargs)
            finally:
                with open(path + ".done", "w") as f:
                    f.write("done\n")

        setattr(owner, attr, hooked)

    if point == "save":
        from paddle_acp.format.checkpoints.multirank import GlobalCheckpointer

        wrap(GlobalCheckpointer, "save")
    elif point == "write":
        import paddle_acp.format.checkpoints.multirank as multirank

        wrap(multirank, "write_checkpoint")  # a part's data and manifest, as the checkpointer calls the writer
    elif point == "remove_own":
        from paddle_acp.format.checkpoints.multirank import GlobalCheckpointer

        wrap(GlobalCheckpointer, "_remove_own")
    else:
        raise ValueError("ACP_TEST_STOP: unknown point %r" % point)
