"""Mid-epoch steps: ``resumable`` batches, step-level checkpoints and mid-epoch resume.

A range's :meth:`StepsMixin.steps` counts the batches of the current epoch, takes a
checkpoint every ``save_every_steps`` batches (or when the time interval passed), turns a
preemption signal into a save at the next batch boundary and, after a restart, skips the
batches a mid-epoch checkpoint already covers. The step state (``step``, the epoch's start
RNG, the loader's state) is saved in the manifest's ``extra``.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any, Iterator, Optional

from paddle_acp.adapter import rng as rng_state
from paddle_acp.errors import CheckpointError, ConfigError
from paddle_acp.runtime.objects import ScriptState
from paddle_acp.runtime.restore import Restorer
from paddle_acp.runtime.saver import SKIP
from paddle_acp.runtime.state import check_main_thread


class StepsMixin:
    """The mid-epoch part of :class:`paddle_acp.runtime.range.EpochRange`: what it reads and
    writes of the range is declared here."""

    name: str
    epoch_no: int
    step: Optional[int]  # batches done in the current epoch (resumable loops only)
    _epoch_start_rng: Optional[dict]
    _epoch_start_objects: Optional[dict]
    script: ScriptState
    _loader_state: Any
    restorer: Restorer
    watcher: Any
    is_writer: bool
    multi: bool
    save_interval: float

    if TYPE_CHECKING:  # defined by the other parts of EpochRange
        @property
        def has_unrestored_state(self) -> bool: ...
        def _save_due(self) -> bool: ...
        def _busy_decision(self, durable: bool, agreed: bool = False) -> str: ...
        def _preempt(self, rng: Optional[dict] = None, objects: Optional[dict] = None) -> None: ...
        def save(self, sync: bool = False, preempt: bool = False, rng: Optional[dict] = None,
                 final: bool = False, objects: Optional[dict] = None, agreed: bool = False) -> None: ...

    def steps(self, iterable: Any, save_every_steps: Optional[int] = None) -> Iterator:
        """Iterate one epoch's batches with step-level checkpoints and mid-epoch resume."""
        check_main_thread("resumable")
        if save_every_steps is not None and (isinstance(save_every_steps, bool) or not isinstance(save_every_steps, int) or save_every_steps < 1):
            raise ConfigError(f"save_every_steps={save_every_steps!r} must be a positive integer")
        skip, extra = self.restorer.take_step_resume()
        loader_state = extra.get("loader_state") if skip else None
        stateful = hasattr(iterable, "state_dict") and hasattr(iterable, "set_state_dict")
        if skip and stateful and loader_state is not None:
            iterable.set_state_dict(loader_state)
            it = iter(iterable)
        else:
            it = iter(iterable)
            for done in range(skip or 0):
                try:
                    next(it)
                except StopIteration:
                    raise CheckpointError(
                        f"range {self.name}: the checkpoint was taken after {skip} batches of epoch {self.epoch_no}, "
                        f"but the data now yields only {done}: the data changed since the checkpoint. "
                        "Restore the original data or start a new job (new PADDLE_JOB_ID)."
                    ) from None
        if skip:  # the RNG state and the script's objects at the step
            self.restorer.restore_step_state(extra, self.script)
        self.step = skip or 0
        first = self.step
        if skip and self.has_unrestored_state:
            it = self._check_batches_left(it, skip)
        while True:
            due = None
            if self.step > first:
                if self.watcher.received is not None:
                    due = "preempt"
                elif self.is_writer and (
                    (save_every_steps is not None and self.step % save_every_steps == 0)
                    or (self.save_interval > 0 and not self.multi and self._save_due()
                        and self._busy_decision(durable=False) != SKIP)
                ):
                    # (a save due by time alone that the busy policy would skip stays due: it is
                    # taken at the first batch boundary after the previous checkpoint is written;
                    # several ranks take interval saves at epoch ends, as their save plan says)
                    due = "save"
            if due is not None:
                # A mid-epoch checkpoint is taken only when another batch follows: one taken after
                # the epoch's last batch would resume with no batch left to run, so the restore
                # (made when the training program first runs) would come after the code that ends
                # the epoch (an eval, sched.step()). The epoch's end then saves or preempts instead.
                # The loader and RNG states are those before the next batch is fetched.
                loader_state = iterable.state_dict() if stateful else None
                rng = rng_state.capture()
                objects = self.script.capture()
                try:
                    batch = next(it)
                except StopIteration:
                    return
                self._loader_state = loader_state
                if due == "preempt":
                    self._preempt(rng=rng, objects=objects)
                else:
                    self.save(rng=rng, objects=objects)
            else:
                try:
                    batch = next(it)
                except StopIteration:
                    return
            yield batch
            self.step += 1

    def _check_batches_left(self, it: Iterator, skip: int) -> Iterator:
        """Refuse to resume silently wrong from a checkpoint taken after an epoch's last batch
        (earlier builds took such checkpoints): with no batch left, the restore would come too late."""
        try:
            first = next(it)
        except StopIteration:
            pass
        else:
            return itertools.chain([first], it)
        loaded = self.restorer.loaded
        raise CheckpointError(
            f"range {self.name}: checkpoint {loaded.name if loaded else '?'} was taken after the last "
            f"batch ({skip}) of epoch {self.epoch_no}, so no batch is left to run before the epoch ends and its state "
            "cannot be restored in time (it was written by an earlier paddle-acp, which took such checkpoints). "
            "Delete that checkpoint (the previous one is then used) or start a new job (new PADDLE_JOB_ID)."
        )


    def _step_extra(self) -> dict:
        if self.step is None:
            return {}
        extra = {"epoch_start_rng": self._epoch_start_rng, "loader_state": self._loader_state}
        if self._epoch_start_objects is not None:
            extra["epoch_start_objects"] = self._epoch_start_objects
        return extra

