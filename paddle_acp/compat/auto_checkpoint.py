"""Drop-in for ``paddle.base.incubate.checkpoint.auto_checkpoint``, fixed for Paddle 3.x.

``python -m paddle_acp run`` makes Paddle's module names (``paddle.base.incubate.checkpoint.auto_checkpoint``
and ``paddle.incubate.checkpoint.auto_checkpoint``) resolve here, so scripts written for Paddle's API
run unchanged. The names and their meaning are Paddle's; the work is paddle-acp's:

* :func:`train_epoch_range` is paddle-acp's loop (saves every epoch end once
  ``save_checkpoint_inter`` seconds passed, the last epoch included).
* :func:`_get_train_epoch_range` returns a :class:`TrainEpochRange` view of
  the active range (``name``, ``restored_from``, ``get()``, ``_exe_status``)
  or ``None``.
* :class:`AutoCheckpointChecker` reads the PaddleCloud environment like
  Paddle's, but a missing or invalid variable raises
  :class:`paddle_acp.errors.ConfigError` instead of ``sys.exit(1)``.
* :class:`ExeTrainStatus`, :func:`_can_auto_checkpoint`,
  :func:`_check_program_oprole` (PIR and legacy IR), ``CONST_CHECKPOINT`` /
  ``CONST_MEMORYINIT``; :class:`CheckpointSaver`, :class:`PaddleModel` and
  :class:`SerializableBase` are re-exported from
  :mod:`paddle_acp.compat.checkpoint_saver` as Paddle's module did.

The programs are fed to the range by paddle-acp's ``Executor.run`` hook;
:func:`_auto_checkpoint` (which Paddle's executor still calls on one legacy
path) only forwards when that hook is not installed.
"""

from __future__ import annotations

import json
import logging
import weakref
from typing import Dict, Optional

from paddle_acp import config as _config
from paddle_acp.adapter.programs import program_info, unwrap
from paddle_acp.compat.checkpoint_saver import CheckpointSaver, PaddleModel, SerializableBase
from paddle_acp.errors import AcpError, CheckpointError
from paddle_acp.runtime.epoch_range import CONST_CHECKPOINT, CONST_MEMORYINIT, active_range, train_epoch_range
from paddle_acp.runtime.range import EpochRange
from paddle_acp.secrets import redact

__all__ = [
    "train_epoch_range",
    "TrainEpochRange",
    "AutoCheckpointChecker",
    "ExeTrainStatus",
    "CheckpointSaver",
    "PaddleModel",
    "SerializableBase",
    "CONST_CHECKPOINT",
    "CONST_MEMORYINIT",
]

logger = logging.getLogger("paddle_acp")

g_checker: Optional["AutoCheckpointChecker"] = None


# -- the environment ----------------------------------------------------------
class AutoCheckpointChecker:
    """The auto-checkpoint environment, read like Paddle's checker.

    With ``PADDLE_RUNNING_ENV=PADDLE_EDL_AUTO_CHECKPOINT`` the PaddleCloud
    variables are validated (``PADDLE_JOB_ID``, ``PADDLE_TRAINER_ID`` and
    ``PADDLE_EDL_HDFS_CHECKPOINT_PATH`` are required; ``PADDLE_EDL_HDFS_NAME``
    too unless ``PADDLE_EDL_ONLY_FOR_CE_TEST=1``): a problem raises
    :class:`ConfigError` naming the variable. Otherwise the checker describes
    paddle-acp's own configuration (``PADDLE_ACP_CHECKPOINT_URI``) or an
    inactive one (every field ``None``).
    """

    def __init__(self, env=None):
        self._run_env, cfg = _config.paddlecloud_view_from_env(env)
        self._cfg = cfg
        active = cfg.active
        self._platform = cfg.platform if active else None
        self._job_id = cfg.job_id if active else None
        self._trainer_id = cfg.trainer_id if active else None
        self._hdfs_home = cfg.hdfs_home
        self._hdfs_name = cfg.hdfs_name
        self._hdfs_ugi = cfg.hdfs_ugi
        self._hdfs_checkpoint_path = cfg.hdfs_checkpoint_path
        self._ce_test = int(cfg.ce_test) if active else None
        self._fs_cache = cfg.fs_cache
        interval = cfg.save_interval
        self._save_checkpoint_inter = int(interval) if float(interval).is_integer() else interval

    @property
    def config(self) -> _config.CheckpointConfig:
        """paddle-acp's configuration this checker was read from."""
        return self._cfg

    def valid(self) -> bool:
        """Whether auto-checkpointing is on (never in dygraph mode)."""
        try:
            import paddle

            if paddle.in_dynamic_mode():
                return False
        except ImportError:  # pragma: no cover
            pass
        return self._cfg.active

    def _root(self) -> Optional[str]:
        return self._hdfs_checkpoint_path if self._hdfs_checkpoint_path is not None else self._cfg.uri

    def get_job_path(self) -> str:
        return f"{self._root()}/{self.job_id}"

    def get_range_checkpoint_path(self, name) -> str:
        """Where range ``name``'s checkpoints live (paddle-acp's layout matches Paddle's here)."""
        return f"{self.get_job_path()}/range/{name}"

    def get_exe_checkpoint_path(self, name) -> str:
        """Paddle's per-program location; paddle-acp keeps program state inside the range checkpoints."""
        return f"{self.get_job_path()}/exe/{name}"

    @property
    def save_checkpoint_inter(self):
        return self._save_checkpoint_inter

    @property
    def run_env(self):
        return self._run_env

    @property
    def platform(self):
        return self._platform

    @property
    def job_id(self):
        return self._job_id

    @property
    def trainer_id(self):
        return self._trainer_id

    @property
    def hdfs_home(self):
        return self._hdfs_home

    @property
    def hdfs_name(self):
        return self._hdfs_name

    @property
    def hdfs_ugi(self):
        return self._hdfs_ugi

    @property
    def hdfs_checkpoint_path(self):
        return self._hdfs_checkpoint_path

    @property
    def ce_test(self):
        return self._ce_test

    def __str__(self):
        ugi = self._hdfs_ugi
        if ugi and "," in ugi:  # "user,password": never print the password
            ugi = ugi.split(",", 1)[0] + ",***"
        return (
            f"run_env:{self._run_env} platform:{self._platform} job_id:{self._job_id} "
            f"hdfs_home:{self._hdfs_home} hdfs_name:{redact(self._hdfs_name) if self._hdfs_name else self._hdfs_name} hdfs_ugi:{ugi} "
            f"hdfs_checkpoint_path:{self._hdfs_checkpoint_path} trainer_id:{self._trainer_id} "
            f"ce_test:{self._ce_test}"
        )

    __repr__ = __str__


def _get_checker() -> AutoCheckpointChecker:
    """The process's checker, read once (assign ``g_checker`` to replace it, as Paddle's tests do)."""
    global g_checker
    if g_checker is None:
        g_checker = AutoCheckpointChecker()
    return g_checker


# -- per-program status ---------------------------------------------------------
class ExeTrainStatus(SerializableBase):
    """The status of one training program in a range (Paddle's per-executor record)."""

    def __init__(self):
        self._epoch_no = -1
        self._hash_key = None
        self._key = None
        self._checkpoint_path = None
        self._checkpoint_no = None
        self._restored_from = None
        self._exe = None
        self._program = None
        self._exe_name = None
        self._program_name = None
        self._file_name = "exe_train_status"

    def __eq__(self, t):
        if not isinstance(t, ExeTrainStatus):
            return NotImplemented
        return (
            self._epoch_no == t._epoch_no
            and self._hash_key == t._hash_key
            and self._key == t._key
            and self._checkpoint_path == t._checkpoint_path
            and self._checkpoint_no == t._checkpoint_no
            and self._exe_name == t._exe_name
            and self._program_name == t._program_name
        )

    def __ne__(self, t):
        eq = self.__eq__(t)
        return eq if eq is NotImplemented else not eq

    __hash__ = None  # type: ignore[assignment]  # mutable: unhashable, as in Paddle

    def _to_dict(self):
        return {
            "epoch_no": self._epoch_no,
            "key": self._key,
            "hash_key": self._hash_key,
            "checkpoint_path": self._checkpoint_path,
            "restored_from": self._restored_from,
            "exe_name": self._exe_name,
            "program_name": self._program_name,
            "checkpoint_no": self._checkpoint_no,
        }

    def _serialize(self, pop_keys=("restored_from",)):
        d = self._to_dict()
        for k in pop_keys:
            d.pop(k, None)
        return json.dumps(d)

    def _deserialize(self, s):
        d = json.loads(s)
        try:
            self._epoch_no = d["epoch_no"]
            self._key = d["key"]
            self._hash_key = d["hash_key"]
            self._checkpoint_path = d["checkpoint_path"]
            self._checkpoint_no = d["checkpoint_no"]
            self._exe_name = d["exe_name"]
            self._program_name = d["program_name"]
        except KeyError as exc:
            raise CheckpointError(f"executor train status lacks {exc.args[0]!r}") from None

    def serialize(self, path):
        with open(f"{path}/{self._file_name}", "w") as f:
            f.write(self._serialize())

    def deserialize(self, path):
        with open(f"{path}/{self._file_name}") as f:
            self._deserialize(f.read())

    def __str__(self):
        return self._serialize(())

    __repr__ = __str__


# -- the range view --------------------------------------------------------------
class _RangeState:
    """Compat bookkeeping of one library range (holds no reference to it)."""

    def __init__(self):
        self.statuses: Dict[str, ExeTrainStatus] = {}
        self.manifest = None
        self.manifest_read = False


_states: "weakref.WeakKeyDictionary[EpochRange, _RangeState]" = weakref.WeakKeyDictionary()
_views: "weakref.WeakValueDictionary[int, TrainEpochRange]" = weakref.WeakValueDictionary()


class TrainEpochRange:
    """Paddle's view of an active ``train_epoch_range``: wraps paddle-acp's range.

    Obtained from :func:`_get_train_epoch_range`; not built by user code.
    Attributes not defined here are those of
    :class:`paddle_acp.runtime.range.EpochRange` (``registry``, ``cfg``, ...),
    also available as :attr:`range`.
    """

    def __init__(self, lib_range: EpochRange):
        if not isinstance(lib_range, EpochRange):
            raise TypeError(
                "TrainEpochRange wraps an active paddle-acp range: use train_epoch_range() "
                "and _get_train_epoch_range(), not TrainEpochRange(...)"
            )
        self._range = lib_range
        state = _states.get(lib_range)
        if state is None:
            state = _RangeState()
            _states[lib_range] = state
        self._state = state
        self._read_restored_manifest()

    @property
    def range(self) -> EpochRange:
        return self._range

    def __getattr__(self, name):
        if name.startswith("__") or name in ("_range", "_state"):
            raise AttributeError(name)
        return getattr(self._range, name)

    # Paddle's public surface
    @property
    def name(self):
        return self._range.name

    @property
    def restored_from(self):
        return self._range.restored_from

    def get(self):
        return self._range.get()

    # Paddle's private names its tests read
    @property
    def _name(self):
        return self._range.name

    @property
    def _epoch_no(self):
        return self._range.epoch_no

    @property
    def _max_epoch_num(self):
        return self._range.max_epoch_num

    @property
    def _restored_from(self):
        return self._range.restored_from

    @property
    def _save_checkpoint_inter(self):
        return self._range.save_interval

    @property
    def _checkpoint_path(self):
        r = self._range
        return r.storage.full(r.checkpointer.dir)

    @property
    def _checkpoint_epoch_no(self):
        m = self._state.manifest
        return None if m is None else m.range.epoch_no

    def _read_restored_manifest(self):
        st = self._state
        if st.manifest_read:
            return st.manifest
        st.manifest_read = True
        r = self._range
        if r.restored_from == CONST_CHECKPOINT and r.restored_number is not None:
            try:
                st.manifest = r.checkpointer.read_manifest(r.restored_number)
            except Exception as exc:  # pruned meanwhile: statuses then say memory_init
                logger.debug("cannot re-read checkpoint %s: %s", r.restored_number, exc)
        return st.manifest

    def _last_checkpoint(self):
        r = self._range
        try:
            numbers = r.checkpointer.committed_numbers()
        except Exception as exc:
            logger.debug("cannot list checkpoints of range %s: %s", r.name, exc)
            numbers = []
        if not numbers:
            return None, None
        from paddle_acp.format.layout import final_name

        n = numbers[-1]
        return n, r.storage.full(f"{r.checkpointer.dir}/{final_name(n)}")

    @property
    def _exe_status(self) -> Dict[str, ExeTrainStatus]:
        """One :class:`ExeTrainStatus` per registered training program, by key (a fresh dict)."""
        r = self._range
        st = self._state
        m = st.manifest
        number, path = self._last_checkpoint()
        out = {}
        for e in r.registry.entries:
            t = st.statuses.get(e.key)
            if t is None:
                t = ExeTrainStatus()
                t._key = t._hash_key = e.key
                t._program = e.program
                t._program_name = getattr(e.program, "_auto_checkpoint_name", None) or e.key
                restored = m is not None and m.program(e.key) is not None
                t._restored_from = CONST_CHECKPOINT if restored else CONST_MEMORYINIT
                st.statuses[e.key] = t
            t._epoch_no = r.get()
            t._checkpoint_no = number
            t._checkpoint_path = path
            out[e.key] = t
        return out

    def _to_dict(self):
        return {
            "max_epoch_num": self._max_epoch_num,
            "epoch_no": self._epoch_no,
            "name": self.name,
            "checkpoint_path": self._checkpoint_path,
            "restored_from": self.restored_from,
            "checkpoint_epoch_no": self._checkpoint_epoch_no,
        }

    def _serialize(self, pop_keys=("restored_from", "checkpoint_epoch_no")):
        d = self._to_dict()
        for k in pop_keys:
            d.pop(k, None)
        d["exe_status"] = {k: t._serialize() for k, t in self._exe_status.items()}
        return json.dumps(d)

    def __str__(self):
        return self._serialize(())

    def __repr__(self):
        return f"<TrainEpochRange {self.name} epoch {self.get()} restored_from={self.restored_from}>"


def _get_train_epoch_range() -> Optional[TrainEpochRange]:
    """The active range (a :class:`TrainEpochRange` view), or None outside a range.

    The same view object is returned while the caller keeps it.
    """
    r = active_range()
    if r is None:
        return None
    view = _views.get(id(r))
    if view is None or view._range is not r:
        view = TrainEpochRange(r)
        _views[id(r)] = view
    return view


def __getattr__(name):
    # Paddle's module global, kept live.
    if name == "g_train_epoch_range":
        return _get_train_epoch_range()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- programs ----------------------------------------------------------------------
def _check_program_oprole(program) -> bool:
    """True when ``program`` has backward and optimizer ops (PIR and legacy IR)."""
    try:
        info = program_info(program)
    except AcpError:
        raise  # e.g. a PIR program on Paddle 2.6: refused with its reason, never silently skipped
    except Exception as exc:
        logger.debug("cannot analyse %r: %s", type(program), exc)
        return False
    return info.has_backward and info.has_optimizer


def _is_program(prog) -> bool:
    import paddle
    from paddle.base.framework import Program as LegacyProgram

    if isinstance(prog, paddle.static.CompiledProgram):
        return unwrap(prog) is not prog  # one built from a Graph has no Program
    return isinstance(prog, (LegacyProgram, paddle.pir.Program))


def _can_auto_checkpoint(prog) -> bool:
    """Whether ``prog`` would be checkpointed now: a non-distributed training program while a range is active."""
    if active_range() is None or not _is_program(prog):
        return False
    program = unwrap(prog)
    if getattr(program, "_is_distributed", False):
        return False
    return _check_program_oprole(program)


def _auto_checkpoint(exe, program) -> None:
    """Paddle's executor hook. A no-op while paddle-acp's ``Executor.run`` hook is installed
    (it already registered the program); otherwise registers ``program`` with the active range."""
    r = active_range()
    if r is None:
        return None
    from paddle_acp.runtime import hook

    if hook.installed():
        return None
    import paddle

    r.on_run(exe, program, paddle.static.global_scope())
    return None


def _normal_yield(max_epoch_num):
    """Paddle's plain epoch loop (what ``train_epoch_range`` is when checkpointing is off)."""
    import sys

    end = sys.maxsize if max_epoch_num < 0 else max_epoch_num
    yield from range(0, end)
