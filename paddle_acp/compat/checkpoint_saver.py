"""Drop-in for ``paddle.base.incubate.checkpoint.checkpoint_saver``, fixed for Paddle 3.x.

Paddle's fleet code and tests write a list of :class:`SerializableBase` objects into one numbered checkpoint
directory ``<path>/__paddle_checkpoint__.<N>`` through a Paddle ``FS`` client (``LocalFS`` or ``HDFSClient``).
This is Paddle's format (a ``save_vars`` combined file), not paddle-acp's. Fixes over Paddle 3.3.1:

* the ``.tmp`` directory is created on local storage too (3.3.1's ``LocalFS`` saves failed), and a leftover
  one from an interrupted save is removed;
* uploaded, a one-file checkpoint stays a directory (3.3.1's ``HDFSClient.upload`` made it a file), and the
  upload is verified;
* :meth:`CheckpointSaver.clean_redundant_checkpoints` exists again (fleet calls it) and can keep the newest N;
* :class:`PaddleModel` works for PIR and legacy programs, takes a ``scope`` and saves the LR scheduler state;
* failures raise :class:`paddle_acp.errors.CheckpointError`, not ``assert`` (which ``python -O`` removes).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from typing import Any, ContextManager, Iterable, Iterator, List, Optional, Sequence, Tuple

from paddle_acp.adapter.programs import lr_scheduler_of, persistable_predicate, unwrap
from paddle_acp.errors import CheckpointError

logger = logging.getLogger("paddle_acp")

__all__ = ["SerializableBase", "PaddleModel", "CheckpointSaver", "CHECKPOINT_PREFIX"]

CHECKPOINT_PREFIX = "__paddle_checkpoint__"


class SerializableBase:
    """Something that writes itself into, and reads itself from, a local directory."""

    def serialize(self, path: str) -> None:
        raise NotImplementedError

    def deserialize(self, path: str) -> None:
        raise NotImplementedError


def _inner_program(program: Any) -> Any:
    """The Program of a CompiledProgram (or the program itself); PIR and legacy."""
    import paddle

    inner = unwrap(program)
    if inner is program and isinstance(program, paddle.static.CompiledProgram):
        raise CheckpointError(
            "PaddleModel needs the Program of this CompiledProgram, but it was built from a Graph "
            "(CompiledProgram._program is None)"
        )
    return inner


class PaddleModel(SerializableBase):
    """The persistable variables (and LR scheduler state) of one program, from ``scope`` (default: the global
    scope), in the combined file ``path/_paddle_fleet_param__`` (``paddle.static.save_vars``/``load_vars``)."""

    PARAM_FILE = "_paddle_fleet_param__"
    LR_SCHEDULER_FILE = "_paddle_acp_lr_scheduler.json"

    def __init__(self, exe: Any, program: Any, scope: Any = None) -> None:
        self._exe = exe
        self._origin_program = program
        self._program = _inner_program(program)
        self._scope = scope
        self._file_name = self.PARAM_FILE

    def _scope_guard(self) -> ContextManager[Any]:
        if self._scope is None:
            return contextlib.nullcontext()
        import paddle

        guard: ContextManager[Any] = paddle.static.scope_guard(self._scope)
        return guard

    def _vars(self, io: Any, path: str) -> None:
        """``paddle.static.save_vars`` or ``load_vars`` (``io``) of the program's persistables, in its scope."""
        with self._scope_guard():
            io(self._exe, path, main_program=self._program, predicate=persistable_predicate(), filename=self._file_name)

    def _lr_scheduler(self) -> Any:
        return lr_scheduler_of(self._program)

    def serialize(self, path: str) -> None:
        import paddle

        os.makedirs(path, exist_ok=True)
        self._vars(paddle.static.save_vars, path)
        sched = self._lr_scheduler()
        if sched is not None:
            from paddle_acp.runtime.registry import jsonable

            state = jsonable(sched.state_dict(), "lr_scheduler")
            with open(os.path.join(path, self.LR_SCHEDULER_FILE), "w") as f:
                json.dump(state, f)

    def deserialize(self, path: str) -> None:
        import paddle

        param_file = os.path.join(path, self._file_name)
        if not os.path.isfile(param_file):
            raise CheckpointError(f"{param_file} does not exist: not a PaddleModel checkpoint")
        self._vars(paddle.static.load_vars, path)
        lr_file = os.path.join(path, self.LR_SCHEDULER_FILE)
        if os.path.isfile(lr_file):
            sched = self._lr_scheduler()
            with open(lr_file) as f:
                state = json.load(f)
            if sched is None:
                logger.warning("%s holds LR scheduler state but the program has no lr_scheduler", lr_file)
            else:
                sched.set_state_dict(state)


def _local_fs() -> Any:
    from paddle.distributed.fleet.utils.fs import LocalFS

    return LocalFS()


class CheckpointSaver:
    """Numbered checkpoints ``<path>/__paddle_checkpoint__.<N>`` on a Paddle ``FS``."""

    def __init__(self, fs: Any) -> None:
        self._fs = fs
        self._checkpoint_prefix = CHECKPOINT_PREFIX

    # -- names ---------------------------------------------------------------
    def _parse_no(self, name: str) -> Optional[int]:
        """N for ``__paddle_checkpoint__.N`` (N a plain non-negative integer), else None."""
        parts = name.split(".")
        if len(parts) != 2 or parts[0] != self._checkpoint_prefix:
            return None
        n = parts[1]
        if not (n.isascii() and n.isdigit()) or str(int(n)) != n:
            return None
        return int(n)

    def _path_of(self, root_path: str, number: int) -> str:
        return f"{root_path}/{self._checkpoint_prefix}.{number}"

    def get_checkpoint_no(self, root_path: str) -> List[int]:
        """The numbers of the committed checkpoints (exactly ``__paddle_checkpoint__.<int>``), ascending."""
        found: List[int] = []
        for d in self._fs.list_dirs(root_path):
            n = self._parse_no(d)
            if n is not None:
                found.append(n)
        return sorted(found)

    def _get_last_checkpoint_no(self, root_path: str) -> int:
        nos = self.get_checkpoint_no(root_path)
        return nos[-1] if nos else -1

    # -- save ----------------------------------------------------------------
    @contextlib.contextmanager
    def _staging(
        self, local_cache_path: str, number: int, kind: str, trainer_id: Optional[int]
    ) -> Iterator[Optional[str]]:
        """An empty local staging directory while the block runs, for an ``fs`` that uploads and downloads
        (a directory: a one-file checkpoint must not become a file); None for one that does not."""
        local_fs = _local_fs()
        if not self._fs.need_upload_download():
            yield None
            return
        path = f"{local_cache_path}/{self._checkpoint_prefix}.{number}.{kind}"
        if trainer_id is not None:
            path = f"{path}.{trainer_id}"
        if local_fs.is_exist(path):
            local_fs.delete(path)
        local_fs.mkdirs(path)
        try:
            yield path
        finally:
            local_fs.delete(path)

    def save_checkpoint(
        self,
        path: str,
        slists: Sequence[SerializableBase],
        trainer_id: Optional[int] = None,
        local_cache_path: str = ".cache",
    ) -> Tuple[str, int]:
        """A new checkpoint of ``slists`` under ``path``, renamed into place once complete; returns (path, number)."""
        fs = self._fs
        if not fs.is_exist(path):
            fs.mkdirs(path)
        elif not fs.is_dir(path):
            raise CheckpointError(f"checkpoint path {path} exists and is not a directory")

        number = self._get_last_checkpoint_no(path) + 1
        real_path = self._path_of(path, number)
        tmp_path = f"{real_path}.tmp"
        if fs.is_exist(tmp_path):  # leftover of an interrupted save
            fs.delete(tmp_path)

        with self._staging(local_cache_path, number, "saved_cache", trainer_id) as cache_path:
            if cache_path is None:
                fs.mkdirs(tmp_path)
            try:
                for s in slists:
                    s.serialize(cache_path or tmp_path)
                if cache_path is not None:
                    self._upload_dir(cache_path, tmp_path)
                fs.mv(tmp_path, real_path)
            except BaseException:
                try:
                    fs.delete(tmp_path)
                except Exception as exc:  # removed by the next save anyway
                    logger.debug("could not remove %s: %s", tmp_path, exc)
                raise
        return real_path, number

    def _upload_dir(self, local_dir: str, remote_dir: str) -> None:
        """Upload the contents of ``local_dir`` into ``remote_dir``, created first: ``HDFSClient.upload`` would
        turn a lone file into ``remote_dir`` itself."""
        fs = self._fs
        fs.mkdirs(remote_dir)
        entries = sorted(os.listdir(local_dir))
        if entries:
            fs.upload(local_dir, remote_dir)
        # HDFSClient.upload runs in subprocesses and does not report failures.
        dirs, files = fs.ls_dir(remote_dir)
        missing = sorted(set(entries) - set(dirs) - set(files))
        if missing:
            raise CheckpointError(f"upload of {local_dir} to {remote_dir} is incomplete: missing {', '.join(missing)}")

    # -- load ----------------------------------------------------------------
    def load_checkpoint(
        self,
        path: str,
        slists: Sequence[SerializableBase],
        trainer_id: Optional[int],
        local_cache_path: str = ".cache",
        checkpoint_no: Optional[int] = None,
        ignore_empty: bool = True,
    ) -> Optional[str]:
        """Deserialize ``slists`` from checkpoint ``checkpoint_no`` (default: the newest); returns its path, or
        None when there is none and ``ignore_empty`` (else CheckpointError)."""
        fs = self._fs
        if checkpoint_no is None:
            checkpoint_no = self._get_last_checkpoint_no(path)
            if checkpoint_no < 0:
                if ignore_empty:
                    return None
                raise CheckpointError(f"no checkpoint ({self._checkpoint_prefix}.<N>) under {path}")
        elif isinstance(checkpoint_no, bool) or not isinstance(checkpoint_no, int) or checkpoint_no < 0:
            raise CheckpointError(f"checkpoint_no={checkpoint_no!r} must be an integer >= 0")

        real_path = self._path_of(path, checkpoint_no)
        if not fs.is_dir(real_path):
            raise CheckpointError(f"checkpoint {real_path} does not exist")

        with self._staging(local_cache_path, checkpoint_no, "load_cache", trainer_id) as cache_path:
            if cache_path is not None:
                fs.download(real_path, cache_path)
            for s in slists:
                s.deserialize(cache_path or real_path)
        return real_path

    # -- pruning -------------------------------------------------------------
    def clean_redundant_checkpoints(
        self, root_path: str, reserved: Iterable[int] = (), keep_last: Optional[int] = None
    ) -> List[int]:
        """Delete old checkpoints under ``root_path`` but ``reserved`` and the newest ``keep_last`` (default: 1
        without ``reserved``, as Paddle, else 0); returns the numbers deleted."""
        nos = self.get_checkpoint_no(root_path)
        if not nos:
            return []
        keep = {int(n) for n in reserved}
        if keep_last is None:
            keep_last = 0 if keep else 1
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 0:
            raise CheckpointError(f"keep_last={keep_last!r} must be an integer >= 0")
        if keep_last:
            keep.update(nos[-keep_last:])
        deleted: List[int] = []
        for n in nos:
            if n not in keep:
                self._fs.delete(self._path_of(root_path, n))
                deleted.append(n)
        return deleted
