"""Worker shield: owns how Paddle's DataLoader workers forked while a range is open take the preemption signals.

A job stopped by signalling all its processes at once (Slurm signals every process of the job step; a
launcher may signal a process group) signals the DataLoader's workers (``num_workers>0``) too. A worker
killed by SIGTERM makes Paddle raise ``SystemError`` in the training thread at whatever it runs then
(Paddle's SIGCHLD handler), the preemption save included: no save.

While a range's preemption handlers are installed (:func:`engage`), a worker that Paddle's DataLoader
forks (:func:`paddle_acp.adapter.workers.forking_loader_worker`) blocks the preemption signals from its
first instruction on (the mask, which its threads inherit: Paddle's worker installs its own SIGTERM
handler after the fork, which would replace an ignore but not a block), and one thread of it waits for
them (``sigwaitinfo``): a signal sent by the worker's parent (``Process.terminate()``, which
``multiprocessing`` sends its daemonic children at exit) ends the worker at once with status 0, as
Paddle's own handler does for its parent's SIGTERM; one sent by anyone else (the job's stop) is held
while the parent lives and ends the worker once the parent is gone, however it ended (Paddle's orphaned
workers do not end by themselves). Only the training process acts on it: it saves at the next boundary
and exits, and its loader stops the workers as at any loop's end.

Every child forked meanwhile gets the handlers from before the range back: the range's handler would
only record the signal in a process that has no range (a child the script forks, which
``multiprocessing`` stops with SIGTERM at exit, would not end). A child a worker forks gets the signals
back unblocked; a worker's ``subprocess`` children (no fork hook runs there) inherit the block.
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
    """A range's handlers of the signals ``previous`` names are installed: a child forked from now on
    gets the handlers from before them back (``previous``' values), and a DataLoader worker blocks them."""
    global _shielded
    _shielded = dict(previous)


def release() -> None:
    """The range's handlers are removed: children forked from now on take the signals as this process does."""
    global _shielded
    _shielded = {}


def _wait(signals: FrozenSet[int], parent: int) -> None:
    """A shielded worker's thread: its parent's signal ends the worker; anyone else's (the job's stop) is
    held while the parent lives and ends the worker once the parent is gone (no save left to shield)."""
    held = 0  # the first signal held (0: none)
    while True:
        # (no signal held: nothing to do until one comes; one held: the parent's end is looked for twice a second)
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
