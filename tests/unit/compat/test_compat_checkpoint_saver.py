"""paddle_acp.compat.checkpoint_saver: Paddle's CheckpointSaver / PaddleModel, fixed for 3.x.

Paddle's test_checkpoint_saver.py scenario (names that are not
``__paddle_checkpoint__.<int>`` are ignored; cleaning keeps the newest) plus
what 3.3.1 gets wrong: saving through LocalFS, one-file checkpoints on
upload/download storage, PIR programs.
"""
import contextlib
import os
import shutil

import numpy as np
import paddle
import pytest
from paddle.distributed.fleet.utils.fs import LocalFS
from support.paddle_compat import IRS, legacy_ir_guard

from paddle_acp.compat.checkpoint_saver import CheckpointSaver, PaddleModel, SerializableBase
from paddle_acp.errors import CheckpointError

pytestmark = pytest.mark.usefixtures("static_mode")


class Blob(SerializableBase):
    """Writes/reads one small file (or several, or a sub-directory)."""

    def __init__(self, value="", files=("blob",), subdir=None):
        self.value, self.files, self.subdir = value, files, subdir

    def serialize(self, path):
        assert os.path.isdir(path), "serialize must get an existing directory"
        for f in self.files:
            with open(os.path.join(path, f), "w") as fh:
                fh.write(self.value)
        if self.subdir:
            os.makedirs(os.path.join(path, self.subdir), exist_ok=True)
            with open(os.path.join(path, self.subdir, "inner"), "w") as fh:
                fh.write(self.value)

    def deserialize(self, path):
        with open(os.path.join(path, self.files[0])) as fh:
            self.value = fh.read()
        if self.subdir:
            with open(os.path.join(path, self.subdir, "inner")) as fh:
                assert fh.read() == self.value


class Boom(SerializableBase):
    def serialize(self, path):
        with open(os.path.join(path, "partial"), "w") as fh:
            fh.write("x")
        raise RuntimeError("disk full")


class FakeRemoteFS(LocalFS):
    """A LocalFS that behaves like HDFSClient: upload/download through ``hadoop fs -put/-get``
    of each entry, so a lone file put to a missing path *becomes* that path."""

    def __init__(self):
        self.uploads = []

    def need_upload_download(self):
        return True

    @staticmethod
    def _put(src, dst):
        if os.path.isdir(dst):
            dst = os.path.join(dst, os.path.basename(src))
        if os.path.isdir(src):
            shutil.copytree(src, dst)
        else:
            shutil.copyfile(src, dst)

    def upload(self, local_path, fs_path, multi_processes=5, overwrite=False):
        self.uploads.append((local_path, fs_path))
        entries = [os.path.join(local_path, e) for e in os.listdir(local_path)] if os.path.isdir(local_path) else [local_path]
        for e in entries:
            self._put(e, fs_path)

    def download(self, fs_path, local_path, multi_processes=5, overwrite=False):
        if os.path.isfile(fs_path):
            return self._put(fs_path, local_path)
        for e in os.listdir(fs_path):
            self._put(os.path.join(fs_path, e), local_path)


# -- names and pruning (Paddle's test_checkpoint_saver) --------------------------------
def test_get_checkpoint_no_ignores_other_names(tmp_path):
    fs = LocalFS()
    root = str(tmp_path / "cps")
    s = CheckpointSaver(fs)
    assert s.get_checkpoint_no(root) == []  # missing root
    for d in ("exe.exe", "exe.1", "exe"):
        fs.mkdirs(f"{root}/{d}")
    assert s.get_checkpoint_no(root) == []
    for d in ("__paddle_checkpoint__.0", "__paddle_checkpoint__.exe", "__paddle_checkpoint__.-1",
              "__paddle_checkpoint__.01", "__paddle_checkpoint__.3.tmp", "__paddle_checkpoint__.3",
              "__paddle_checkpoint__.1.2", "__paddle_checkpoint__.", "x__paddle_checkpoint__.4"):
        fs.mkdirs(f"{root}/{d}")
    fs.touch(f"{root}/__paddle_checkpoint__.9")  # a file, not a checkpoint
    assert s.get_checkpoint_no(root) == [0, 3]


def test_clean_redundant_checkpoints_keeps_newest(tmp_path):
    fs = LocalFS()
    root = str(tmp_path / "cps")
    s = CheckpointSaver(fs)
    assert s.clean_redundant_checkpoints(root) == []  # nothing there: fine
    for i in range(5):
        assert s.save_checkpoint(root, [Blob(str(i))]) == (f"{root}/__paddle_checkpoint__.{i}", i)
    fs.mkdirs(f"{root}/exe.1")
    assert s.clean_redundant_checkpoints(root, keep_last=3) == [0, 1]
    assert s.get_checkpoint_no(root) == [2, 3, 4]
    assert s.clean_redundant_checkpoints(root, reserved=[2]) == [3, 4]
    assert s.get_checkpoint_no(root) == [2]
    assert s.save_checkpoint(root, [Blob("5")])[1] == 3  # numbering continues from the newest left
    assert s.clean_redundant_checkpoints(root, reserved=[2], keep_last=1) == []
    assert s.clean_redundant_checkpoints(root) == [2]
    assert s.clean_redundant_checkpoints(root) == []  # twice is fine
    assert s.get_checkpoint_no(root) == [3]
    assert os.path.isdir(f"{root}/exe.1")
    with pytest.raises(CheckpointError):
        s.clean_redundant_checkpoints(root, keep_last=-1)


# -- save / load through LocalFS (3.3.1 fails here) -------------------------------------
def test_local_save_commits_by_rename_and_loads(tmp_path):
    fs = LocalFS()
    root = str(tmp_path / "a" / "b")
    s = CheckpointSaver(fs)
    path, no = s.save_checkpoint(root, [Blob("one", files=("f1", "f2"), subdir="sub")], trainer_id=0)
    assert (path, no) == (f"{root}/__paddle_checkpoint__.0", 0)
    assert sorted(os.listdir(root)) == ["__paddle_checkpoint__.0"]
    assert sorted(os.listdir(path)) == ["f1", "f2", "sub"]
    s.save_checkpoint(root, [Blob("two")])
    b = Blob()
    assert s.load_checkpoint(root, [b], trainer_id=0) == f"{root}/__paddle_checkpoint__.1"
    assert b.value == "two"
    b = Blob(files=("f1",), subdir="sub")
    s.load_checkpoint(root, [b], trainer_id=0, checkpoint_no=0)
    assert b.value == "one"


def test_leftover_tmp_is_replaced_and_failed_save_leaves_nothing(tmp_path):
    fs = LocalFS()
    root = str(tmp_path / "cps")
    s = CheckpointSaver(fs)
    fs.mkdirs(f"{root}/__paddle_checkpoint__.0.tmp")
    fs.touch(f"{root}/__paddle_checkpoint__.0.tmp/stale")
    path, no = s.save_checkpoint(root, [Blob("x")])
    assert no == 0 and os.listdir(path) == ["blob"]
    with pytest.raises(RuntimeError, match="disk full"):
        s.save_checkpoint(root, [Blob("y"), Boom()])
    assert sorted(os.listdir(root)) == ["__paddle_checkpoint__.0"]
    fs.touch(str(tmp_path / "afile"))
    with pytest.raises(CheckpointError, match="not a directory"):
        s.save_checkpoint(str(tmp_path / "afile"), [Blob()])


def test_load_edge_cases(tmp_path):
    s = CheckpointSaver(LocalFS())
    root = str(tmp_path / "cps")
    assert s.load_checkpoint(root, [Blob()], trainer_id=0) is None
    with pytest.raises(CheckpointError, match="no checkpoint"):
        s.load_checkpoint(root, [Blob()], trainer_id=0, ignore_empty=False)
    s.save_checkpoint(root, [Blob("x")])
    with pytest.raises(CheckpointError, match="does not exist"):
        s.load_checkpoint(root, [Blob()], trainer_id=0, checkpoint_no=5)
    for bad in (-1, "0", 1.0, True):
        with pytest.raises(CheckpointError):
            s.load_checkpoint(root, [Blob()], trainer_id=0, checkpoint_no=bad)


# -- upload/download storage (HDFS semantics) -----------------------------------------------
def test_remote_one_file_checkpoint_stays_a_directory(tmp_path):
    fs = FakeRemoteFS()
    root = str(tmp_path / "remote")
    cache = str(tmp_path / "cache")
    s = CheckpointSaver(fs)
    path, no = s.save_checkpoint(root, [Blob("solo")], trainer_id=3, local_cache_path=cache)
    assert os.path.isdir(path) and os.listdir(path) == ["blob"]
    assert fs.uploads == [(f"{cache}/__paddle_checkpoint__.0.saved_cache.3", f"{root}/__paddle_checkpoint__.0.tmp")]
    path, _ = s.save_checkpoint(root, [Blob("many", files=("a", "b"), subdir="d")], local_cache_path=cache)
    assert sorted(os.listdir(path)) == ["a", "b", "d"]
    assert os.listdir(cache) == []  # caches removed
    b = Blob()
    s.load_checkpoint(root, [b], trainer_id=3, checkpoint_no=0, local_cache_path=cache)
    assert b.value == "solo"
    b = Blob(files=("a",), subdir="d")
    s.load_checkpoint(root, [b], trainer_id=3, local_cache_path=cache)
    assert b.value == "many"
    assert os.listdir(cache) == []


def test_remote_incomplete_upload_is_an_error(tmp_path):
    class Lossy(FakeRemoteFS):
        def upload(self, local_path, fs_path, multi_processes=5, overwrite=False):
            pass  # HDFSClient.upload loses errors of its worker processes

    s = CheckpointSaver(Lossy())
    root = str(tmp_path / "remote")
    with pytest.raises(CheckpointError, match="incomplete"):
        s.save_checkpoint(root, [Blob("x")], local_cache_path=str(tmp_path / "cache"))
    assert s.get_checkpoint_no(root) == []
    assert os.listdir(root) == []


# -- PaddleModel in both IRs ---------------------------------------------------------------
def _build(ir, with_sched):
    guard = legacy_ir_guard() if ir == "legacy" else contextlib.nullcontext()
    with guard, paddle.utils.unique_name.guard():
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            x = paddle.static.data("pm_x", [-1, 4], "float32")
            loss = paddle.mean(paddle.static.nn.fc(x, 3, weight_attr=paddle.ParamAttr(name="pm_w"),
                                                   bias_attr=paddle.ParamAttr(name="pm_b")))
            lr = paddle.optimizer.lr.StepDecay(0.1, step_size=1, gamma=0.5) if with_sched else 0.1
            paddle.optimizer.Adam(learning_rate=lr).minimize(loss)
    return main, startup, loss, (lr if with_sched else None)


def _state(scope, names):
    return {n: np.array(scope.find_var(n).get_tensor()).copy() for n in names}


@pytest.mark.parametrize("ir", IRS)
@pytest.mark.parametrize("custom_scope", [False, True])
def test_paddle_model_round_trip(tmp_path, ir, custom_scope):
    from paddle_acp.adapter.programs import program_info

    guard = legacy_ir_guard if ir == "legacy" else contextlib.nullcontext
    main, startup, loss, sched = _build(ir, with_sched=True)
    exe = paddle.static.Executor(paddle.CPUPlace())
    scope = paddle.static.Scope()
    names = [n for n in program_info(main).persistables if not n.startswith("learning_rate")]
    assert any("moment" in n for n in names)
    with guard(), paddle.static.scope_guard(scope):
        exe.run(startup)
        runnable = main if ir == "pir" else paddle.static.CompiledProgram(main)
        for _ in range(2):
            exe.run(runnable, feed={"pm_x": np.random.rand(2, 4).astype("float32")}, fetch_list=[loss])
            sched.step()
        saved = _state(scope, names)
        model = PaddleModel(exe, runnable, scope=scope if custom_scope else None)
        s = CheckpointSaver(LocalFS())
        if custom_scope:
            s.save_checkpoint(str(tmp_path), [model])
        else:
            with paddle.static.scope_guard(scope):
                s.save_checkpoint(str(tmp_path), [model])
        assert sorted(os.listdir(tmp_path / "__paddle_checkpoint__.0")) == [
            PaddleModel.LR_SCHEDULER_FILE, PaddleModel.PARAM_FILE]
        for n in names:
            scope.find_var(n).get_tensor().set(np.zeros_like(saved[n]), paddle.CPUPlace())
        sched.step()
        s.load_checkpoint(str(tmp_path), [model], trainer_id=0)
        restored = _state(scope, names)
    for n in names:
        assert restored[n].shape == saved[n].shape and np.array_equal(restored[n], saved[n]), n
    assert sched.last_epoch == 2


def test_paddle_model_errors(tmp_path):
    main, startup, _, _ = _build("pir", with_sched=False)
    exe = paddle.static.Executor(paddle.CPUPlace())
    with pytest.raises(CheckpointError, match="does not exist"):
        PaddleModel(exe, main).deserialize(str(tmp_path))

    class GraphCompiled(paddle.static.CompiledProgram):
        def __init__(self):
            self._program = None

    with pytest.raises(CheckpointError, match="Graph"):
        PaddleModel(exe, GraphCompiled())
