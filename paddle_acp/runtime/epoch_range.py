"""Epoch ranges: ``train_epoch_range`` and the per-range state it saves and restores.

Each ``train_epoch_range`` loop in a script is a range named ``_range_0``,
``_range_1``, ... in creation order, with its own epoch counter and
checkpoints. While a range is active, the Executor.run hook hands every
program to :meth:`TrainEpochRange.on_run`.
"""

from __future__ import annotations

import itertools
import logging
import os
import sys
import threading
import time
from typing import Iterable, Iterator, Optional

from paddle_acp import config as _config
from paddle_acp.adapter import rng as rng_state
from paddle_acp.adapter import version as paddle_version
from paddle_acp.adapter.programs import program_info, unwrap
from paddle_acp.adapter.tensors import Arena, ProgramSnapshot, copy_into, dtype_name, layout
from paddle_acp.errors import AcpError, CheckpointError, ConfigError
from paddle_acp.format.checkpointer import Checkpointer, LoadedCheckpoint, Snapshot
from paddle_acp.format.fencing import Fence
from paddle_acp.format.manifest import RangeRecord
from paddle_acp.format.metrics import MetricsLog
from paddle_acp.format.multirank import PREEMPT_PART_WAIT, GlobalCheckpointer, decide_mode, fleet_degrees, load_newest
from paddle_acp.runtime import preemption
from paddle_acp.runtime.registry import Registry
from paddle_acp.runtime.saver import QUEUE, SKIP, WAIT, Saver, busy_action, lower_thread_priority
from paddle_acp.storage.base import open_storage, redact

logger = logging.getLogger("paddle_acp")

CONST_CHECKPOINT = "checkpoint"
CONST_MEMORYINIT = "memory_init"

_active: Optional["TrainEpochRange"] = None
# The range the Executor.run hook feeds: the active one, or an ended one whose restored
# programs have not run yet (a finished job restarted: its loop yields nothing, but code
# after the loop must see the restored state).
_hooked: Optional["TrainEpochRange"] = None
_range_counter = 0
_logged_inactive = False
# One message per range whose final checkpoint failed (``paddle-acp run`` exits 1 when any).
final_save_failures: list = []
_fences: dict = {}  # (storage URI, job id) -> this process's writer Fence (one generation per start)


def _fence_for(storage, job_id: str, rank: int) -> Fence:
    key = (storage.uri, job_id)
    f = _fences.get(key)
    if f is None:
        f = _fences[key] = Fence.take(storage, job_id, rank)
    return f


_marked_jobs: set = set()  # (storage URI, job id) whose job marker this process wrote or found

# The ``queue`` busy policy allocates its second snapshot buffer only when the host keeps
# at least this much memory available after it.
QUEUE_HEADROOM = 1 << 30


def mem_available() -> Optional[int]:
    """MemAvailable of /proc/meminfo in bytes, or None where it cannot be read."""
    try:
        with open("/proc/meminfo", "rb") as f:
            for line in f:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def active_range() -> Optional["TrainEpochRange"]:
    return _active


_static = None


def _paddle_static():
    global _static
    if _static is None:
        import paddle.static

        _static = paddle.static
    return _static


def _check_main_thread(what: str) -> None:
    if threading.current_thread() is not threading.main_thread():
        raise CheckpointError(
            f"paddle-acp {what} must run on the main thread, not in thread "
            f"{threading.current_thread().name!r}"
        )


def open_storage_for(cfg: _config.CheckpointConfig):
    user = cfg.hdfs_ugi.split(",", 1)[0] if cfg.hdfs_ugi else None
    return open_storage(cfg.uri, hdfs_user=user, hadoop_home=cfg.hdfs_home, cache_dir=cfg.fs_cache)


def _next_range_name() -> str:
    global _range_counter
    name = f"_range_{_range_counter}"
    _range_counter += 1
    return name


class TrainEpochRange:
    """The state of one active ``train_epoch_range`` loop."""

    def __init__(self, max_epoch_num: int, name: str, cfg: _config.CheckpointConfig, save_checkpoint_inter=None):
        if isinstance(max_epoch_num, bool) or not isinstance(max_epoch_num, int):
            raise ConfigError(f"max_epoch_num={max_epoch_num!r} must be an integer")
        self.max_epoch_num = max_epoch_num
        self.name = name
        self.cfg = cfg
        if save_checkpoint_inter is None:
            self.save_interval = cfg.save_interval
        else:
            self.save_interval = _config.check_interval(save_checkpoint_inter, "save_checkpoint_inter")
        self.epoch_no = -1
        self.restored_from = CONST_MEMORYINIT
        self.restored_number: Optional[int] = None
        self.registry = Registry()
        self.storage = open_storage_for(cfg)
        # several ranks (PADDLE_TRAINERS_NUM > 1): every rank writes its part, rank 0 commits
        self.multi = cfg.multi_rank
        self.rank = cfg.trainer_id
        self.fence: Optional[Fence] = None
        self.checkpointer = Checkpointer(self.storage, cfg.job_id, name, cfg.max_to_keep, single_writer=cfg.trainer_id == 0)
        self.gcheckpointer = GlobalCheckpointer(
            self.storage, cfg.job_id, name, cfg.trainer_id, cfg.world_size or 1, cfg.max_to_keep, cfg.part_timeout
        )
        self.mode: Optional[str] = None  # decided at each save (multi-rank)
        self._mode_logged: Optional[str] = None
        self.saver = Saver(self._persist, cfg.async_save)
        self._arena = Arena()
        self._arena2 = Arena()  # the ``queue`` policy's second buffer, allocated when first needed
        self._queue_ok: Optional[bool] = None  # whether that buffer fits in host memory (decided once)
        self._skip_streak = 0
        self._arena_thread: Optional[threading.Thread] = None
        self._closed = False  # ended: no more saves, the arena is freed
        self._seen_program = self._seen_scope = None  # the last registered (program, scope) run
        self.metrics = MetricsLog(self.storage, cfg.job_id, cfg.trainer_id)
        self._loaded: Optional[LoadedCheckpoint] = None
        self._last_save = time.monotonic()
        self._last_bucket = self._bucket()
        self.is_writer = self.multi or cfg.trainer_id == 0
        self.step: Optional[int] = None  # batches done in the current epoch (resumable loops only)
        self._resume_step: Optional[int] = None
        self._resume_extra: dict = {}
        self._epoch_start_rng: Optional[dict] = None
        self._loader_state = None
        self.inherited: Optional[TrainEpochRange] = None  # an ended range whose restore is pending
        self._final_submitted = False  # the save after the last epoch was submitted
        self._last_persist_error: Optional[BaseException] = None  # of the last save that ended
        self.failed = False  # registering a program raised (e.g. the model changed since the checkpoint)
        self.exit_on_preempt = preemption.exit_on_preempt_from_env()
        self.watcher = preemption.PreemptionWatcher(preemption.signals_from_env())
        if cfg.trainer_id == 0:
            marker = (self.storage.uri, cfg.job_id)
            try:
                if marker not in _marked_jobs:  # once per process, not per range
                    self.checkpointer.write_job_marker()
                    _marked_jobs.add(marker)
                self.fence = _fence_for(self.storage, cfg.job_id, cfg.trainer_id)
            except AcpError as exc:
                raise ConfigError(
                    f"checkpoint location {redact(cfg.uri)!r} (from {cfg.source}) is not reachable or not writable: {exc}"
                ) from exc
            self.checkpointer.fence = self.gcheckpointer.fence = self.fence
        if cfg.trainer_id > 0 and cfg.world_size is None:
            logger.warning(
                "PADDLE_TRAINER_ID=%d but PADDLE_TRAINERS_NUM is not set: this trainer restores trainer 0's state "
                "and writes nothing. Set PADDLE_TRAINERS_NUM (paddle.distributed.launch does) for per-rank state.",
                cfg.trainer_id,
            )
        running = cfg.rank_state if cfg.rank_state != "auto" else (
            "per-rank" if any(v > 1 for v in fleet_degrees().values()) else None)
        loaded = load_newest(self.checkpointer, self.gcheckpointer, running if self.multi else None)
        if self.multi:
            self.gcheckpointer.base = loaded.name if loaded is not None else None
            self.gcheckpointer.discard_newer(loaded.position_key if loaded is not None else None)
        if loaded is not None:
            self._loaded = loaded
            rec = loaded.manifest.range
            # A mid-epoch checkpoint (step set) resumes inside its epoch.
            self.epoch_no = rec.epoch_no if rec.step is None else rec.epoch_no - 1
            self._resume_step = rec.step
            self._resume_extra = loaded.manifest.extra
            self.restored_from = CONST_CHECKPOINT
            self.restored_number = loaded.manifest.number
        # Several ranks must take the same checkpoints, and they do not decide together yet
        # (busy_action is the one place such a decision would go): they wait.
        self.busy_policy = WAIT if self.multi else cfg.busy_policy
        if self.multi and cfg.busy_policy != WAIT and self.rank == 0:
            logger.info("range %s: %d ranks: a save that comes due while the previous checkpoint is being written "
                        "waits for it (PADDLE_ACP_BUSY_POLICY=%s applies to jobs of one writer)",
                        name, cfg.world_size, cfg.busy_policy)
        if self.is_writer:  # written with the first save's metrics: marks a (re)start in `paddle-acp stats`
            self.metrics.add({"event": "start", "time": time.time(), "pid": os.getpid(), "range": name,
                              "restored": self.restored_number, "policy": self.busy_policy})

    # -- the loop ------------------------------------------------------------
    def epochs(self) -> Iterator[int]:
        _check_main_thread("train_epoch_range")
        end = sys.maxsize if self.max_epoch_num < 0 else self.max_epoch_num
        start = self.epoch_no + 1
        if self._loaded is not None:
            m = self._loaded.manifest
            if self._resume_step is not None and self._resume_extra.get("epoch_start_rng") is not None:
                # mid-epoch: replay the epoch's start; resumable() restores m.rng after fast-forward
                rng_state.restore(self._resume_extra["epoch_start_rng"])
            elif m.rng is not None:
                rng_state.restore(m.rng)
            at = f"epoch {start}" + (f", step {self._resume_step}" if self._resume_step is not None else "")
            if self._loaded.global_manifest is not None:
                logger.info(
                    "range %s of job %s: rank %d resuming at %s from global checkpoint %s (%s, %s)",
                    self.name, self.cfg.job_id, self.rank, at, self._loaded.name, self._loaded.path,
                    self._loaded.global_manifest.topology(),
                )
            else:
                logger.info(
                    "range %s of job %s: resuming at %s from checkpoint %d (%s)",
                    self.name, self.cfg.job_id, at, m.number, self._loaded.path,
                )
        self._log_plan(start, end)
        self._last_save = time.monotonic()
        self.watcher.install()
        try:
            for i in range(start, end):
                self.epoch_no = i
                self.step = None
                self._epoch_start_rng = rng_state.capture() if self._resume_step is None else self._resume_extra.get("epoch_start_rng")
                yield i
                if self._resume_step is not None:
                    raise CheckpointError(
                        f"range {self.name}: the checkpoint was taken at step {self._resume_step} of epoch {i}, "
                        "but this epoch did not iterate its data through paddle_acp.resumable(...)"
                    )
                self.step = None
                self._end_of_epoch(last=(i == end - 1))
        finally:
            self.watcher.uninstall()

    def _log_plan(self, start: int, end: int) -> None:
        """Say at the start when and where checkpoints will be taken (a short run with the default
        interval of 900 s checkpoints only after its last epoch: a kill before that loses it all)."""
        where = f"{self.storage.uri.rstrip('/')}/{self.checkpointer.dir}"
        if not self.is_writer:
            logger.info("range %s of job %s: trainer %d restores from %s; only trainer 0 writes checkpoints",
                        self.name, self.cfg.job_id, self.cfg.trainer_id, where)
            return
        if start >= end:
            return
        if self.save_interval == 0:
            when = "at the end of every epoch"
        else:
            when = (f"at the end of the first epoch ending {self.save_interval:g} s or more after the previous "
                    "checkpoint (save_checkpoint_inter / PADDLE_ACP_SAVE_INTERVAL; 0 = every epoch)")
        last = "" if self.max_epoch_num < 0 else f" and after the last epoch ({end - 1})"
        logger.info("range %s of job %s: checkpoints go to %s %s%s", self.name, self.cfg.job_id, where, when, last)

    def _end_of_epoch(self, last: bool) -> None:
        if self.watcher.received is not None:
            self._preempt()
        if not self.is_writer:
            return
        if last:
            self.save(final=True)
            self._final_submitted = True
        elif self._save_due():
            self.save()

    def _bucket(self) -> int:
        if self.save_interval <= 0:
            return 0
        return int(time.time() // self.save_interval)

    def _save_due(self) -> bool:
        """Whether ``save_checkpoint_inter`` seconds have passed. Several ranks decide on the
        wall clock's interval buckets, so that they pick the same boundary without talking
        (a boundary that falls between two ranks' decisions abandons that one checkpoint)."""
        if self.save_interval <= 0:
            return True
        if self.multi:
            return self._bucket() != self._last_bucket
        return time.monotonic() - self._last_save >= self.save_interval

    def _preempt(self, rng: Optional[dict] = None) -> None:
        signum = self.watcher.received
        if self.is_writer:
            self.save(sync=True, preempt=True, rng=rng)
        logger.warning("range %s: preempted by signal %d at epoch %d%s", self.name, signum, self.epoch_no,
                       f" step {self.step}" if self.step is not None else "")
        if self.exit_on_preempt:
            raise preemption.Preempted(signum)
        self.watcher.clear()

    def steps(self, iterable: Iterable, save_every_steps: Optional[int] = None) -> Iterator:
        """Iterate one epoch's batches with step-level checkpoints and mid-epoch resume."""
        _check_main_thread("resumable")
        if save_every_steps is not None and (isinstance(save_every_steps, bool) or not isinstance(save_every_steps, int) or save_every_steps < 1):
            raise ConfigError(f"save_every_steps={save_every_steps!r} must be a positive integer")
        skip, extra = self._resume_step, self._resume_extra
        self._resume_step, self._resume_extra = None, {}
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
        if skip and self._loaded is not None and self._loaded.manifest.rng is not None:
            rng_state.restore(self._loaded.manifest.rng)
        self.step = skip or 0
        first = self.step
        if skip and self.restore_pending:
            it = self._check_batches_left(it, skip)
        while True:
            due = None
            if self.step > first:
                if self.watcher.received is not None:
                    due = "preempt"
                elif self.is_writer and (
                    (save_every_steps is not None and self.step % save_every_steps == 0)
                    or (self.save_interval > 0 and self._save_due() and self._busy_decision(durable=False) != SKIP)
                ):
                    # (a save due by time alone that the busy policy would skip stays due: it is
                    # taken at the first batch boundary after the previous checkpoint is written)
                    due = "save"
            if due is not None:
                # A mid-epoch checkpoint is taken only when another batch follows: one taken after
                # the epoch's last batch would resume with no batch left to run, so the restore
                # (made when the training program first runs) would come after the code that ends
                # the epoch (an eval, sched.step()). The epoch's end then saves or preempts instead.
                # The loader and RNG states are those before the next batch is fetched.
                loader_state = iterable.state_dict() if stateful else None
                rng = rng_state.capture()
                try:
                    batch = next(it)
                except StopIteration:
                    return
                self._loader_state = loader_state
                if due == "preempt":
                    self._preempt(rng=rng)
                else:
                    self.save(rng=rng)
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
        raise CheckpointError(
            f"range {self.name}: checkpoint {self._loaded.name if self._loaded else '?'} was taken after the last "
            f"batch ({skip}) of epoch {self.epoch_no}, so no batch is left to run before the epoch ends and its state "
            "cannot be restored in time (it was written by an earlier paddle-acp, which took such checkpoints). "
            "Delete that checkpoint (the previous one is then used) or start a new job (new PADDLE_JOB_ID)."
        )

    # -- hook entry point ----------------------------------------------------
    def on_run(self, exe, program, scope) -> None:
        """Called by the hook before every Executor.run while this range is active."""
        try:
            self._on_run(exe, program, scope)
        except AcpError:
            self.failed = True  # the error is the user's; nothing more is restored at the loop's end
            raise

    def _on_run(self, exe, program, scope) -> None:
        if program is None:
            program = _paddle_static().default_main_program()
        if scope is None:
            scope = _paddle_static().global_scope()
        if program is self._seen_program and scope is self._seen_scope:
            return  # the same registered program as last time: the common case, kept cheap
        inner = unwrap(program)
        if self.registry.lookup(inner, scope) is not None:
            self._seen_program, self._seen_scope = program, scope
            return
        if getattr(inner, "_is_distributed", False):
            return  # parameter-server programs: their state lives on the servers (as in Paddle)
        info = program_info(inner)
        if not info.is_training:
            return
        _check_main_thread("checkpointing")
        place = getattr(exe, "place", None)
        entry, is_new = self.registry.add(info, inner, scope, place)
        if not is_new:
            return
        logger.info("range %s: registered training program %s (%s)", self.name, entry.key, info.label)
        if self.multi and self._loaded is not None:
            self._check_topology()
        self._prepare_arena()
        if self._loaded is not None and self._restore_entry(entry):
            return
        prev = self.inherited
        if prev is not None and prev.restore_pending and prev._loaded.manifest.program(entry.key) is not None:
            # first run after an earlier, finished range restored from a checkpoint and this
            # range has none yet: the program continues from the state that range ended with
            prev._restore_entry(entry)

    def _check_topology(self) -> None:
        """A job that keeps per-rank state must not resume from a replicated checkpoint
        (every rank would silently load rank 0's state)."""
        mode, why = decide_mode(self.cfg.rank_state, self.registry.entries)
        if mode != "per-rank":
            return
        g = self._loaded.global_manifest
        if g is None:
            raise CheckpointError(
                f"rank {self.rank}: checkpoint {self._loaded.name} of range {self.name} (job {self.cfg.job_id}) was written by "
                f"trainer 0 alone (replicated state), but this job keeps per-rank state ({why}; world size "
                f"{self.cfg.world_size}): every rank would load rank 0's state. Set PADDLE_ACP_RANK_STATE=replicated if "
                "the ranks' state is identical, or start a new job (a new PADDLE_JOB_ID)."
            )
        if g.mode != "per-rank":
            raise self.gcheckpointer.topology_error(g, "per-rank", f"this job keeps per-rank state ({why}) and a "
                                                    "replicated checkpoint holds only rank 0's tensors")

    def _follower(self) -> bool:
        """A rank other than 0 whose tensors are replicated: its part holds no tensors."""
        return self.multi and self.rank != 0 and decide_mode(self.cfg.rank_state, self.registry.entries)[0] == "replicated"

    def _prepare_arena(self) -> None:
        """Allocate and fault in the snapshot arena in the background, so the first save
        does not pay for it on the training thread."""
        if self._closed or not self.is_writer or not (self.saver.async_save or self.storage.local) or self._follower():
            return
        size = layout([e.views() for e in self.registry.entries])
        self._join_arena()

        def prefault():
            lower_thread_priority()
            self._arena.ensure(size)

        self._arena_thread = threading.Thread(target=prefault, name="paddle-acp-arena", daemon=True)
        self._arena_thread.start()

    def _join_arena(self) -> None:
        t, self._arena_thread = self._arena_thread, None
        if t is not None:
            t.join()

    def _restore_entry(self, entry) -> bool:
        """Restore ``entry`` from this range's checkpoint; False when the checkpoint lacks it."""
        m = self._loaded.manifest
        rec = m.program(entry.key)
        if rec is None:
            saved = {t.name for p in m.programs for t in p.tensors}
            clash = sorted(set(entry.info.persistables) & saved)
            if clash:
                raise CheckpointError(
                    f"training program {entry.key} ({entry.info.label}) does not match any program in checkpoint "
                    f"{m.number} at {self._loaded.path}, yet shares variables with it ({', '.join(clash[:5])}"
                    f"{', ...' if len(clash) > 5 else ''}): the script's model changed since the checkpoint "
                    "was written. Use a new PADDLE_JOB_ID or remove the old checkpoints."
                )
            logger.warning(
                "range %s: training program %s is not in checkpoint %d; it starts from its current state",
                self.name, entry.key, m.number,
            )
            return False
        entry.restore(self._loaded, rec.lr_scheduler)
        logger.info("range %s: restored program %s from checkpoint %d", self.name, entry.key, m.number)
        if not self._loaded.arrays:
            self._release_restore()
        return True

    def _release_restore(self) -> None:
        """Every restored program has its state back: drop the loaded arrays."""
        global _hooked
        if self._loaded is not None:
            self._loaded.close()
        if _hooked is self and _active is not self:
            _hooked = None

    def restore_pending_into_global_scope(self) -> None:
        """Write the state of restored programs that never ran into the global scope, by name.

        A restarted job whose range has no epochs left runs no program inside
        it; code after the loop must still see the trained state. (The LR
        scheduler follows when the program first runs.)
        """
        if not self.restore_pending:
            return
        import paddle
        from paddle.base import framework

        scope = paddle.static.global_scope()
        self._check_global_scope(scope)
        # each tensor stays where it lives (a GPU job's parameters on its GPU); one the scope holds
        # nothing for yet goes to Paddle's default device, as the executor would put it
        default = framework._current_expected_place_()
        for p in self._loaded.manifest.programs:
            self._loaded.write_program(p.key, scope, None, consume=False, default_place=default)
        logger.info("range %s: wrote the restored state of programs that did not run into the global scope", self.name)

    def _check_global_scope(self, scope) -> None:
        """The checkpoint's pending tensors must fit the variables the scope already holds (same
        dtype and shape), as a registered program's fingerprint guarantees mid-run: a model changed
        since the checkpoint must fail here, not leave the old model in the scope."""
        m = self._loaded.manifest
        pending = self._loaded._pending
        bad = []
        for p in m.programs:
            for t in p.tensors:
                if (p.key, t.name) not in pending:
                    continue
                var = scope.find_var(t.name)
                if var is None:
                    continue
                try:
                    tensor = var.get_tensor()
                except Exception:  # not a dense tensor (a reader, a list): the program differs
                    bad.append(f"{t.name}: checkpoint {t.dtype}{list(t.shape)}, scope holds a non-tensor variable")
                    continue
                if not tensor._is_initialized():
                    continue
                try:
                    dt = dtype_name(tensor)
                except CheckpointError:
                    dt = str(tensor._dtype())
                shape = list(tensor.shape())
                if dt != t.dtype or shape != list(t.shape):
                    bad.append(f"{t.name}: checkpoint {t.dtype}{list(t.shape)}, program {dt}{shape}")
        if bad:
            self._release_restore()
            raise CheckpointError(
                f"range {self.name} of job {self.cfg.job_id} finished in checkpoint {m.number} at {self._loaded.path}, "
                f"but the model changed since: {len(bad)} variable(s) differ ({'; '.join(bad[:5])}"
                f"{'; ...' if len(bad) > 5 else ''}). Nothing was written into the scope. Use a new PADDLE_JOB_ID "
                "or remove the old checkpoints to train the new model."
            )

    @property
    def restore_pending(self) -> bool:
        return self._loaded is not None and bool(self._loaded.arrays)

    # -- saving --------------------------------------------------------------
    def save(self, sync: bool = False, preempt: bool = False, rng: Optional[dict] = None, final: bool = False) -> None:
        """Checkpoint now (at an epoch end, or mid-epoch when ``self.step`` is set); ``rng``:
        the RNG states to record, when they were captured earlier than now.

        ``sync`` (preemption) and ``final`` (the range's last epoch) saves are durable:
        they wait for the checkpoint in flight and are committed before this returns
        (``final`` when the range closes). Any other save that comes due while the
        previous checkpoint is still being written follows the busy policy
        (``PADDLE_ACP_BUSY_POLICY``, see :func:`paddle_acp.runtime.saver.busy_action`).
        """
        _check_main_thread("checkpointing")
        t0 = time.perf_counter()
        action = self._busy_decision(durable=sync or final or not self.saver.async_save)
        if action == SKIP:
            self._skip(t0)
            return
        waited = self.saver.wait() if action != QUEUE else 0.0
        irs = sorted({e.info.ir for e in self.registry.entries})
        import paddle

        self._join_arena()
        programs = [e.views() for e in self.registry.entries]
        mode = None
        if self.multi:
            mode, why = decide_mode(self.cfg.rank_state, self.registry.entries)
            if mode != self._mode_logged:
                logger.info("range %s: rank %d of %d saves %s state (%s)", self.name, self.rank, self.cfg.world_size, mode, why)
                self._mode_logged = mode
            if mode == "replicated" and self.rank != 0:  # one copy of the tensors: rank 0's
                programs = [ProgramSnapshot(p.key, p.label, [], p.lr_scheduler) for p in programs]
        size = layout(programs)
        image = None
        buffer = 0
        if action == QUEUE:
            inflight = self.saver.inflight  # it may finish meanwhile; the other buffer stays free
            buffer = 1 if inflight is None or inflight.buffer == 0 else 0
        if size and ((self.saver.async_save and not sync) or self.storage.local):
            # async: training goes on while the saver writes, so copy into the reused arena;
            # local disks: the aligned copy lets the write bypass the page cache (O_DIRECT),
            # which costs far less CPU and time than a buffered write of the views
            image = (self._arena2 if buffer else self._arena).ensure(size)
            copy_into(programs, image)
        snap = Snapshot(
            range=RangeRecord(self.name, self.epoch_no, self.max_epoch_num, self.step),
            programs=programs,
            image=image,
            data_size=size,
            rng=rng if rng is not None else rng_state.capture(),
            paddle_version=paddle.__version__,
            ir="+".join(irs),
            extra=self._step_extra(),
            mode=mode,
            part_wait=PREEMPT_PART_WAIT if preempt else None,
            buffer=buffer,
            durable=sync or final,
            queued=action == QUEUE,
            skipped_before=self._skip_streak,
        )
        self._skip_streak = 0
        snap.stall_seconds = time.perf_counter() - t0
        snap.waited_seconds = waited
        if action == QUEUE:
            self.saver.enqueue(snap)
        else:
            self.saver.submit(snap)
        if sync:
            self.saver.wait()
        self._last_save = time.monotonic()
        self._last_bucket = self._bucket()

    def _busy_decision(self, durable: bool) -> str:
        """What a save due now does (``saver.busy_action`` with this range's state)."""
        busy = self.saver.busy
        queue_free = busy and self.busy_policy == QUEUE and self.saver.queue_free
        return busy_action(self.busy_policy, busy, durable, queue_free, queue_free and self._queue_fits())

    def _queue_fits(self) -> bool:
        """Whether the ``queue`` policy's second buffer (the size of the first) fits in host
        memory; decided once per range, with one log line when it does not."""
        if self._queue_ok is None:
            need = self._arena.nbytes
            avail = mem_available()
            self._queue_ok = avail is None or self._arena2.nbytes >= need or avail - need >= QUEUE_HEADROOM
            if not self._queue_ok:
                logger.warning(
                    "range %s: PADDLE_ACP_BUSY_POLICY=queue: a second snapshot buffer of %d bytes would leave less "
                    "than %d MiB of host memory available (MemAvailable %d bytes); saves that come due while the "
                    "previous checkpoint is being written are skipped instead",
                    self.name, need, QUEUE_HEADROOM >> 20, avail,
                )
        return self._queue_ok

    def _skip(self, t0: float) -> None:
        """Do not take this checkpoint: the previous one is still being written."""
        self.saver.stats.skipped += 1
        self._skip_streak += 1
        at = f"epoch {self.epoch_no}" + ("" if self.step is None else f" step {self.step}")
        if self._skip_streak == 1:
            logger.info(
                "range %s: checkpoint at %s skipped: the previous checkpoint is still being written "
                "(PADDLE_ACP_BUSY_POLICY=%s); the next due one is taken (further skips in a row are not logged)",
                self.name, at, self.busy_policy,
            )
        self.metrics.add({
            "event": "skipped", "time": time.time(), "pid": os.getpid(), "range": self.name,
            "epoch": self.epoch_no, "step": self.step, "stall_s": round(time.perf_counter() - t0, 6),
            "policy": self.busy_policy,
        })

    def _step_extra(self) -> dict:
        if self.step is None:
            return {}
        return {"epoch_start_rng": self._epoch_start_rng, "loader_state": self._loader_state}

    def _persist(self, snap: Snapshot) -> None:
        t0 = time.perf_counter()
        record = {
            "time": time.time(), "pid": os.getpid(), "range": self.name, "epoch": snap.range.epoch_no,
            "step": snap.range.step, "stall_s": round(snap.stall_seconds, 6), "waited_s": round(snap.waited_seconds, 6),
            "policy": self.busy_policy,
        }
        if snap.queued:
            record["queued"] = True
        if snap.skipped_before:
            record["skipped_before"] = snap.skipped_before
        if self.multi:
            self._persist_part(snap, record, t0)
            return
        try:
            number, nbytes = self.checkpointer.save(snap)
        except BaseException as exc:
            self._record_failure(record, exc, t0)
            raise
        self._last_persist_error = None
        dt = time.perf_counter() - t0
        mbps = nbytes / dt / 1e6 if dt > 0 else 0.0
        record.update(event="saved", ok=True, number=number, bytes=nbytes, persist_s=round(dt, 6),
                      throughput_mb_s=round(mbps, 3))
        self.metrics.add(record)
        if snap.durable:
            self.metrics.flush()
        else:
            self.metrics.flush_due()
        logger.info(
            "range %s: saved checkpoint %d (epoch %d%s): %d bytes, stall %.3f s, persist %.3f s, %.1f MB/s",
            self.name, number, snap.range.epoch_no, "" if snap.range.step is None else f" step {snap.range.step}",
            nbytes, snap.stall_seconds, dt, mbps,
        )

    def _record_failure(self, record: dict, exc: BaseException, t0: float) -> None:
        self._last_persist_error = exc
        record.update(event="failed", ok=False, error=str(exc)[:500], persist_s=round(time.perf_counter() - t0, 6))
        self.metrics.add(record)
        self.metrics.flush_due()

    def _persist_part(self, snap: Snapshot, record: dict, t0: float) -> None:
        try:
            res = self.gcheckpointer.save(snap, snap.mode)
        except BaseException as exc:
            self._record_failure(record, exc, t0)
            raise
        self._last_persist_error = None
        dt = time.perf_counter() - t0
        record.update(event="saved" if res.committed is not False else "failed", ok=res.committed is not False,
                      name=res.name, bytes=res.nbytes, persist_s=round(dt, 6), rank=self.rank,
                      committed=res.committed, parts_wait_s=round(res.waited, 6))
        self.metrics.add(record)
        if snap.durable:
            self.metrics.flush()
        else:
            self.metrics.flush_due()
        at = f"epoch {snap.range.epoch_no}" + ("" if snap.range.step is None else f" step {snap.range.step}")
        if res.committed is None:
            logger.info("range %s: rank %d wrote its part of checkpoint %s (%s): %d bytes, stall %.3f s, persist %.3f s",
                        self.name, self.rank, res.name, at, res.nbytes, snap.stall_seconds, dt)
        elif res.committed:
            logger.info("range %s: saved global checkpoint %s (%s, %d ranks, %s): %d bytes of rank 0, stall %.3f s, "
                        "persist %.3f s (%.3f s waiting for the other parts)", self.name, res.name, at,
                        self.cfg.world_size, snap.mode, res.nbytes, snap.stall_seconds, dt, res.waited)

    def close(self) -> None:
        """Wait for the pending save to commit, then free the snapshot arena: an ended range
        saves no more. Freed here, not when the garbage collector gets to the range: left
        to the collector, a 1.2 GB arena cost the next range's first epoch 1-3 s."""
        try:
            self.saver.wait()
            if self.is_writer:
                self.metrics.flush()
            if self._final_submitted and self._last_persist_error is not None:
                self._final_save_failed(self._last_persist_error)
        finally:
            self._closed = True
            self._join_arena()
            self._arena.release()
            self._arena2.release()

    def _final_save_failed(self, error: BaseException) -> None:
        """The checkpoint after the last epoch failed: say so once, loudly, at the end
        (``paddle-acp run`` also exits with status 1)."""
        try:
            numbers = self.checkpointer.committed_numbers()
        except AcpError:
            numbers = []
        then = f"resumes from checkpoint {numbers[-1]}" if numbers else "starts from scratch"
        msg = (
            f"range {self.name} of job {self.cfg.job_id}: the FINAL checkpoint (epoch {self.epoch_no}) was NOT saved "
            f"({error}); a restart {then} and trains the remaining epochs again. "
            f"Fix the storage at {redact(self.cfg.uri)} (space, permissions)"
        )
        final_save_failures.append(msg)
        logger.error("%s", msg)

    def get(self) -> int:
        return self.epoch_no


def train_epoch_range(max_epoch_num: int, save_checkpoint_inter=None) -> Iterator[int]:
    """Yield epoch numbers; checkpoint the training state at epoch ends and resume after a restart.

    ``save_checkpoint_inter``: seconds between checkpoints (0 = every epoch);
    ``None`` takes ``PADDLE_ACP_SAVE_INTERVAL`` / ``PADDLE_EDL_SAVE_CHECKPOINT_INTER``
    (default 900). The last epoch is always saved. A negative
    ``max_epoch_num`` means no end.
    """
    global _active, _hooked, _logged_inactive
    cfg = _config.from_env()
    if not cfg.active:
        if save_checkpoint_inter is not None:
            _config.check_interval(save_checkpoint_inter, "save_checkpoint_inter")
        if not _logged_inactive:
            logger.info("paddle-acp checkpointing is off: %s", cfg.inactive_reason)
            _logged_inactive = True
        end = sys.maxsize if max_epoch_num < 0 else max_epoch_num
        yield from range(0, end)
        return
    _check_main_thread("train_epoch_range")
    paddle_version.refuse_pir_mode()  # Paddle 2.6: legacy IR only
    paddle_version.warn_rng_limit()  # Paddle 2.6: the CPU engine state cannot be carried across processes
    if _active is not None:
        raise CheckpointError(f"train_epoch_range cannot be nested (range {_active.name} is active)")
    r = TrainEpochRange(max_epoch_num, _next_range_name(), cfg, save_checkpoint_inter)
    prev = _hooked
    while prev is not None and not prev.restore_pending:
        prev = prev.inherited
    r.inherited = prev
    _active = _hooked = r
    closed = False
    try:
        yield from r.epochs()
    except GeneratorExit:  # the loop was left early (break, or an exception in its body)
        closed = True
        raise
    finally:
        _active = None
        try:
            if r.failed or sys.is_finalizing():
                pass  # the range already raised its error; at interpreter exit imports fail
            elif closed:  # an exception raised here would be "ignored" (printed as noise): log it
                try:
                    r.restore_pending_into_global_scope()
                except AcpError as exc:
                    logger.error("%s", exc)
            else:
                r.restore_pending_into_global_scope()
        finally:
            _hooked = r if r.restore_pending else None
            if sys.is_finalizing():  # garbage-collected at interpreter exit: imports would fail
                r._closed = True
            else:
                r.close()


def resumable(iterable: Iterable, save_every_steps: Optional[int] = None) -> Iterator:
    """Iterate an epoch's batches so that checkpoints can be taken, and resumed, mid-epoch.

    Inside an active ``train_epoch_range``: counts batches, checkpoints every
    ``save_every_steps`` batches (and when ``save_checkpoint_inter`` > 0 seconds
    passed), saves and exits at the next batch after a preemption signal, and
    after a restart skips the batches the checkpoint already covers (through
    ``set_state_dict`` when the loader has ``state_dict``/``set_state_dict``,
    else by re-iterating it: the loader must then be deterministic). Outside a
    range it is ``iter(iterable)``.
    """
    r = _active
    if r is None:
        return iter(iterable)
    return r.steps(iterable, save_every_steps)


def reset() -> None:
    """Forget all process state, as a restart would (waits for a pending save first)."""
    global _active, _hooked, _range_counter, _logged_inactive
    if _active is not None:
        _active.close()
    _active = _hooked = None
    _fences.clear()
    _range_counter = 0
    _logged_inactive = False
    final_save_failures.clear()
    _marked_jobs.clear()
