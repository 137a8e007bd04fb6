"""Restorer: owns the checkpoint a range resumes from, and writes its state back.

:meth:`Restorer.load_newest` picks the newest valid checkpoint when the range opens; each training program gets
its tensors and LR scheduler back on its first ``Executor.run`` (:meth:`Restorer.restore_entry`), and programs
that never ran in the range are written into the global scope when the loop ends.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Optional, Tuple

from paddle_acp import config as _config
from paddle_acp.adapter import rng as rng_state
from paddle_acp.adapter.fleet import decide_mode, fleet_degrees
from paddle_acp.adapter.tensors import NON_TENSOR, default_place, scope_var_meta, write_program
from paddle_acp.errors import CheckpointError
from paddle_acp.format.checkpoints.multirank import GlobalCheckpointer
from paddle_acp.format.checkpoints.part_reader import PartReader
from paddle_acp.format.checkpoints.restart import load_newest
from paddle_acp.format.engine.reader import Landing, LoadedCheckpoint
from paddle_acp.format.engine.stager import Stager
from paddle_acp.runtime.objects import ScriptState
from paddle_acp.runtime.registry import ProgramEntry, Registry

logger = logging.getLogger("paddle_acp")

CONST_CHECKPOINT = "checkpoint"
CONST_MEMORYINIT = "memory_init"


class Restorer:
    """The checkpoint one range resumed from (:attr:`loaded`), the position it resumes at and the
    state it still holds for programs that did not run yet."""

    def __init__(self, name: str, cfg: _config.CheckpointConfig, numbered: PartReader,
                 global_checkpointer: GlobalCheckpointer, on_released: Callable[[], None], stager: Stager) -> None:
        """``on_released``: called when every restored program has its state back; ``stager``: copies the
        restored bytes into the scope's tensors."""
        self.name = name
        self.cfg = cfg
        self.several_ranks = cfg.multi_rank
        self.rank = cfg.trainer_id
        self.numbered = numbered  # reads an earlier release's ckpt-N
        self.global_checkpointer = global_checkpointer
        self.on_released = on_released
        self.stager = stager
        self.loaded: Optional[LoadedCheckpoint] = None
        self.restored_from = CONST_MEMORYINIT
        self.restored_number: Optional[int] = None
        self.resume_epoch = -1  # the last epoch the checkpoint completed (-1: none)
        # the step a mid-epoch checkpoint was taken at and its step state, until the epoch's steps took them
        self.resume_step: Optional[int] = None
        self.resume_extra: Dict[str, Any] = {}

    def load_newest(self, landing: Optional[Landing] = None) -> None:
        """Load the newest valid checkpoint of this range (if any) and record its position. ``landing``:
        where its bytes are read into (:meth:`Persister.landing`)."""
        cfg = self.cfg
        running = cfg.rank_state if cfg.rank_state != "auto" else (
            "per-rank" if any(v > 1 for v in fleet_degrees().values()) else None)
        self.numbered.landing = self.global_checkpointer.landing = landing
        try:
            loaded = load_newest(self.numbered, self.global_checkpointer, running if self.several_ranks else None,
                                 start_fresh=cfg.start_fresh)
        finally:
            self.numbered.landing = self.global_checkpointer.landing = None
        if self.several_ranks or self.rank == 0:  # every writer (a trainer > 0 of no world size writes nothing)
            self.global_checkpointer.resume_from(loaded)  # its parts are tagged with it; its marks checked at saves
            self.global_checkpointer.start.discard_newer(loaded.position_key if loaded is not None else None)
        if loaded is not None:
            self.loaded = loaded
            rec = loaded.manifest.range
            self.resume_epoch = rec.epoch_no if rec.step is None else rec.epoch_no - 1
            self.resume_step = rec.step
            self.resume_extra = loaded.manifest.extra
            self.restored_from = CONST_CHECKPOINT
            self.restored_number = loaded.manifest.number

    def take_step_resume(self) -> Tuple[Optional[int], Dict[str, Any]]:
        """The mid-epoch step to resume at and its step state, once (the epoch's steps consume them)."""
        skip, extra = self.resume_step, self.resume_extra
        self.resume_step, self.resume_extra = None, {}
        return skip, extra

    def resume_rng(self, start: int, script: ScriptState) -> None:
        """At the loop's start: restore the checkpoint's RNG state and say where the loop resumes."""
        if self.loaded is None:
            return
        m = self.loaded.manifest
        if self.resume_step is not None and self.resume_extra.get("epoch_start_rng") is not None:
            # mid-epoch: replay the epoch's start; resumable() restores m.rng after fast-forward
            rng_state.restore(self.resume_extra["epoch_start_rng"])
        elif m.rng is not None:
            rng_state.restore(m.rng)
        # the script's objects the same way: mid-epoch, at the epoch's start now, at the step after the skip
        script.restore(m.extra.get("epoch_start_objects" if self.resume_step is not None else "objects"),
                       f"checkpoint {self.loaded.name}")
        at = f"epoch {start}" + (f", step {self.resume_step}" if self.resume_step is not None else "")
        held = m.range.epoch_no
        holds = (f"the state after epoch {held}" if self.resume_step is None
                 else f"the state after {self.resume_step} steps of epoch {held}")
        if self.loaded.global_manifest is not None and self.several_ranks:
            logger.info(
                "range %s of job %s: rank %d resuming at %s from global checkpoint %s (%s, %s): it holds %s",
                self.name, self.cfg.job_id, self.rank, at, self.loaded.name, self.loaded.path,
                self.loaded.global_manifest.topology(), holds,
            )
        else:
            logger.info(
                "range %s of job %s: resuming at %s from checkpoint %s (%s): it holds %s",
                self.name, self.cfg.job_id, at, self.loaded.name, self.loaded.path, holds,
            )

    def restore_step_state(self, extra: Dict[str, Any], script: ScriptState) -> None:
        """After a mid-epoch resume skipped the batches done: the RNG state and the script's objects at the step."""
        if self.loaded is None:
            return
        if self.loaded.manifest.rng is not None:
            rng_state.restore(self.loaded.manifest.rng)
        script.restore(extra.get("objects"), f"checkpoint {self.loaded.name}")

    def holds(self, key: str) -> bool:
        """Whether the checkpoint resumed from holds state for the program ``key`` not yet restored."""
        return self.loaded is not None and self.has_unrestored_state and self.loaded.manifest.program(key) is not None

    def restore_entry(self, entry: ProgramEntry) -> bool:
        """Restore ``entry`` from this range's checkpoint; False when the checkpoint lacks it."""
        m = self._resumed.manifest
        rec = m.program(entry.key)
        if rec is None:
            saved = {t.name for p in m.programs for t in p.tensors}
            clash = sorted(set(entry.info.persistables) & saved)
            if clash:
                raise CheckpointError(
                    f"training program {entry.key} ({entry.info.label}) does not match any program in checkpoint "
                    f"{self._resumed.name} at {self._resumed.path}, yet shares variables with it ({', '.join(clash[:5])}"
                    f"{', ...' if len(clash) > 5 else ''}): the script's model changed since the checkpoint "
                    "was written. Use a new PADDLE_JOB_ID or remove the old checkpoints."
                )
            logger.warning(
                "range %s: training program %s is not in checkpoint %s; it starts from its current state",
                self.name, entry.key, self._resumed.name,
            )
            return False
        entry.restore(self._resumed, rec.lr_scheduler, self.stager)
        logger.info("range %s: restored program %s from checkpoint %s", self.name, entry.key, self._resumed.name)
        if not self._resumed.arrays:
            self._release()
        return True

    def _release(self) -> None:
        """Every restored program has its state back: drop the loaded arrays."""
        if self.loaded is not None:
            self.loaded.close()
        self.on_released()

    def write_unrestored_into_global_scope(self) -> None:
        """Write the state of restored programs that never ran into the global scope, by name (a finished job
        restarted runs no program in its range; code after the loop must still see the trained state)."""
        if not self.has_unrestored_state:
            return
        import paddle

        scope = paddle.static.global_scope()
        self._check_global_scope(scope)
        # each tensor stays where it lives; one the scope lacks goes to Paddle's default device
        default = default_place()
        for p in self._resumed.manifest.programs:
            write_program(self._resumed, p.key, scope, None, consume=False, default_place=default, stager=self.stager)
        logger.info("range %s: wrote the restored state of programs that did not run into the global scope", self.name)

    def _check_global_scope(self, scope: Any) -> None:
        """The checkpoint's unrestored tensors must fit the variables the scope holds (dtype and shape): a model
        changed since the checkpoint fails here."""
        m = self._resumed.manifest
        unrestored = set(self._resumed.arrays)  # the keys (the arrays are read on access only)
        bad = []
        for p in m.programs:
            for t in p.tensors:
                if (p.key, t.name) not in unrestored:
                    continue
                held = scope_var_meta(scope, t.name)
                if held is None:
                    continue
                if held == NON_TENSOR:
                    bad.append(f"{t.name}: checkpoint {t.dtype}{list(t.shape)}, scope holds a non-tensor variable")
                    continue
                dt, shape = held
                if dt != t.dtype or shape != list(t.shape):
                    bad.append(f"{t.name}: checkpoint {t.dtype}{list(t.shape)}, program {dt}{shape}")
        if bad:
            self._release()
            raise CheckpointError(
                f"range {self.name} of job {self.cfg.job_id} finished in checkpoint {self._resumed.name} at {self._resumed.path}, "
                f"but the model changed since: {len(bad)} variable(s) differ ({'; '.join(bad[:5])}"
                f"{'; ...' if len(bad) > 5 else ''}). Nothing was written into the scope. Use a new PADDLE_JOB_ID "
                "or remove the old checkpoints to train the new model."
            )

    @property
    def _resumed(self) -> LoadedCheckpoint:
        """The checkpoint this range resumed from (called only where the range has one)."""
        assert self.loaded is not None, "the range resumed from no checkpoint"
        return self.loaded

    @property
    def has_unrestored_state(self) -> bool:
        """The checkpoint this range resumed from still holds tensors no program took back yet."""
        return self.loaded is not None and bool(self.loaded.arrays)

    def check_topology(self, registry: Registry) -> None:
        """A job that keeps per-rank state must not resume from a replicated checkpoint
        (every rank would silently load rank 0's state)."""
        mode, why = decide_mode(self.cfg.rank_state, registry.entries)
        if mode != "per-rank":
            return
        g = self._resumed.global_manifest
        if g is None:
            raise CheckpointError(
                f"rank {self.rank}: checkpoint {self._resumed.name} of range {self.name} (job {self.cfg.job_id}) was written by "
                f"trainer 0 alone (replicated state), but this job keeps per-rank state ({why}; world size "
                f"{self.cfg.world_size}): every rank would load rank 0's state. Set PADDLE_ACP_RANK_STATE=replicated if "
                "the ranks' state is identical, or start a new job (a new PADDLE_JOB_ID)."
            )
        if g.mode != "per-rank":
            raise self.global_checkpointer.topology_error(g, "per-rank", f"this job keeps per-rank state ({why}) and a "
                                                          "replicated checkpoint holds only rank 0's tensors")
