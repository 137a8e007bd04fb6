"""Mid-epoch steps: owns where the loop is (epoch, step) and the ``resumable`` batch iteration.

:class:`Position` is the loop's place and the step state a mid-epoch checkpoint records; :class:`ResumableSteps`
iterates one epoch's batches, saves at due batch boundaries and after a preemption signal, and after a restart
skips the batches a mid-epoch checkpoint already covers.
"""

from __future__ import annotations

import dataclasses
import itertools
from typing import Any, Callable, Dict, Iterator, Optional

from paddle_acp.adapter import rng as rng_state
from paddle_acp.errors import CheckpointError, ConfigError
from paddle_acp.runtime.objects import ScriptState
from paddle_acp.runtime.preemption import PreemptionWatcher
from paddle_acp.runtime.restore import Restorer
from paddle_acp.runtime.state import check_main_thread

# a mid-epoch save or preemption: called with the RNG states and the script's objects captured before the next batch
StepSave = Callable[[Optional[Dict[str, Any]], Optional[Dict[str, Any]]], None]


class Position:
    """Where a range's loop is, and the step state a mid-epoch checkpoint records."""

    def __init__(self) -> None:
        self.epoch_no = -1
        self.step: Optional[int] = None  # batches done in the current epoch (resumable loops only)
        self.every: Optional[int] = None  # the epoch's ``save_every_steps`` (resumable loops only)
        self.epoch_start_rng: Optional[Dict[str, Any]] = None
        self.epoch_start_objects: Optional[Dict[str, Any]] = None
        self.loader_state: Any = None

    def at(self) -> str:
        """``epoch E`` or ``epoch E step S`` (log lines, the ranks' save plan)."""
        return f"epoch {self.epoch_no}" + ("" if self.step is None else f" step {self.step}")

    def step_extra(self) -> Dict[str, Any]:
        """The manifest's ``extra`` of a checkpoint taken now (empty at an epoch end)."""
        if self.step is None:
            return {}
        extra: Dict[str, Any] = {"epoch_start_rng": self.epoch_start_rng, "loader_state": self.loader_state}
        if self.epoch_start_objects is not None:
            extra["epoch_start_objects"] = self.epoch_start_objects
        return extra


@dataclasses.dataclass(eq=False)
class ResumableSteps:
    """One range's ``resumable`` iteration: step-level checkpoints and mid-epoch resume."""

    range_name: str
    position: Position
    restorer: Restorer
    script: ScriptState
    watcher: PreemptionWatcher
    is_writer: bool
    due_by_time: Callable[[], bool]  # whether a save is due by the interval alone now
    save: StepSave  # take a mid-epoch checkpoint
    preempt: StepSave  # take one and stop

    def steps(self, iterable: Any, save_every_steps: Optional[int] = None) -> Iterator[Any]:
        """Iterate one epoch's batches with step-level checkpoints and mid-epoch resume."""
        check_main_thread("resumable")
        if save_every_steps is not None and (isinstance(save_every_steps, bool) or not isinstance(save_every_steps, int) or save_every_steps < 1):
            raise ConfigError(f"save_every_steps={save_every_steps!r} must be a positive integer")
        pos = self.position
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
                        f"range {self.range_name}: the checkpoint was taken after {skip} batches of epoch {pos.epoch_no}, "
                        f"but the data now yields only {done}: the data changed since the checkpoint. "
                        "Restore the original data or start a new job (new PADDLE_JOB_ID)."
                    ) from None
        if skip:  # the RNG state and the script's objects at the step
            self.restorer.restore_step_state(extra, self.script)
        pos.step, pos.every = skip or 0, save_every_steps
        first = pos.step
        if skip and self.restorer.has_unrestored_state:
            it = self._check_batches_left(it, skip)
        while True:
            due = None
            if pos.step > first:
                if self.watcher.received is not None:
                    due = "preempt"
                elif self.is_writer and (
                    (save_every_steps is not None and pos.step % save_every_steps == 0) or self.due_by_time()
                ):
                    due = "save"
            if due is not None:
                # Only when another batch follows: one after the last batch would resume with no batch left,
                # so its restore (at the program's first run) would come after the epoch's end code. The
                # loader and RNG states are those before the next batch is fetched.
                loader_state = iterable.state_dict() if stateful else None
                rng = rng_state.capture()
                objects = self.script.capture()
                try:
                    batch = next(it)
                except StopIteration:
                    return
                pos.loader_state = loader_state
                if due == "preempt":
                    self.preempt(rng, objects)
                else:
                    self.save(rng, objects)
            else:
                try:
                    batch = next(it)
                except StopIteration:
                    return
            yield batch
            pos.step += 1

    def _check_batches_left(self, it: Iterator[Any], skip: int) -> Iterator[Any]:
        """Refuse a checkpoint taken after an epoch's last batch (earlier builds took them): no restore in time."""
        try:
            first = next(it)
        except StopIteration:
            pass
        else:
            return itertools.chain([first], it)
        loaded = self.restorer.loaded
        raise CheckpointError(
            f"range {self.range_name}: checkpoint {loaded.name if loaded else '?'} was taken after the last "
            f"batch ({skip}) of epoch {self.position.epoch_no}, so no batch is left to run before the epoch ends and "
            "its state cannot be restored in time (it was written by an earlier paddle-acp, which took such "
            "checkpoints). Delete that checkpoint (the previous one is then used) or start a new job (new PADDLE_JOB_ID)."
        )
