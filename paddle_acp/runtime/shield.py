"""Worker shield: owns how Paddle's DataLoader workers forked while a range is open take the preemption signals.

A job stopped by signalling all its processes at once signals the DataLoader's workers too, and a worker killed by
SIGTERM makes Paddle raise ``SystemError`` in the training thread (its SIGCHLD handler): the preemption save is
lost. While a range's handlers are installed (:func:`engage`), a worker Paddle forks blocks the preemption signals
from its first instruction on (a block, not an ignore: Paddle's worker installs its own SIGTERM handler after the
fork), and one thread of it waits for them: a signal from its parent (``Process.terminate()``) ends it at once
with status 0, as Paddle's handler would; one from anyone else is held while the parent lives and ends the worker
once the parent is gone. Every other child forked meanwhile gets the handlers from before the range back; a
worker's own children get the signals back unblocked (``subprocess`` children inherit the block).
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Dict, FrozenSet

from paddle_acp.adapter.workers import forking_loader_worker

# the preemption signals of the installed handlers -> the handler each had before them (empty: none installed)
_shielded: Dict[int, signal._HANDLER] = {}
# in a shielded worker: the signals it blocks (a child it forks unblocks them)
_blocked_here: FrozenSet[int] = frozenset()


def engage(previous: Dict[int, signal._HANDLER]) -> None:
    """A range's handlers are installed: a child forked from now on gets ``previous`` back; a worker blocks them."""
    global _shielded
    _shielded = dict(previous)


def release() -> None:
    """The range's handlers are removed: children take the signals as this process does."""
    global _shielded
    _shielded = {}


def _wait(signals: FrozenSet[int], parent: int) -> None:
    """A shielded worker's thread: its parent's signal ends the worker; anyone else's, once the parent is gone."""
    held = 0  # the first signal held (0: none)
    while True:
        # (one held: the parent's end is looked for twice a second)
        info = signal.sigwaitinfo(signals) if not held else signal.sigtimedwait(signals, 0.5)
        if info is not None:
            if info.si_pid == parent:  # the loader's own process ends its worker (status 0, as Paddle's handler)
                os._exit(0)
            held = held or info.si_signo
        if held and os.getppid() != parent:  # the training process is gone: the job's stop ends the worker
            os._exit(128 + held)


def _after_fork_in_child() -> None:
    global _shielded, _blocked_here
    previous, _shielded = _shielded, {}  # the child is no range's process: the handlers from before the range
    signals = frozenset(previous)
    try:
        for sig, handler in previous.items():
            signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
        if _blocked_here:  # a child of a shielded worker: the signals as its parent's parent had them
            signal.pthread_sigmask(signal.SIG_UNBLOCK, _blocked_here)
            _blocked_here = frozenset()
        if signals and forking_loader_worker():
            signal.pthread_sigmask(signal.SIG_BLOCK, signals)  # before the thread: it inherits the mask
            try:
                threading.Thread(target=_wait, args=(signals, os.getppid()), name="paddle-acp-worker-shield",
                                 daemon=True).start()
            except RuntimeError:  # no thread: no block (the parent could not end the worker)
                signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
            else:
                _blocked_here = signals
    except (OSError, ValueError):  # nothing to report to (a fork child logs nothing): the signals as before
        pass


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
