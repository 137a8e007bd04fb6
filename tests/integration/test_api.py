"""Public API edge cases: inactive ranges, threads, nesting, bad arguments, unwritable paths."""

import itertools
import os
import subprocess
import sys
import threading

import pytest

import paddle_acp as acp


@pytest.fixture(autouse=True)
def clean_state(monkeypatch):
    for k in list(os.environ):
        if k.startswith(("PADDLE_ACP_", "PADDLE_EDL_", "PADDLE_RUNNING_", "PADDLE_JOB_ID", "PADDLE_TRAINER_ID")):
            monkeypatch.delenv(k)
    acp.simulate_restart()
    yield
    acp.simulate_restart()


def test_inactive_range_is_plain_range_and_creates_nothing(tmp_path, caplog):
    os.chdir(tmp_path)
    assert list(acp.train_epoch_range(4)) == [0, 1, 2, 3]
    assert list(itertools.islice(acp.train_epoch_range(-1), 5)) == [0, 1, 2, 3, 4]
    assert "checkpointing is off" in caplog.text
    assert os.listdir(tmp_path) == []
    assert acp.active_range() is None


def test_range_names_count_from_zero_and_reset(tmp_path, monkeypatch):
    monkeypatch.setenv("PADDLE_ACP_CHECKPOINT_URI", str(tmp_path))
    names = []
    for _ in range(2):
        for _ in acp.train_epoch_range(1, 0):
            names.append(acp.active_range().name)
    assert names == ["_range_0", "_range_1"]
    acp.simulate_restart()
    for _ in acp.train_epoch_range(1, 0):
        assert acp.active_range().name == "_range_0"
    assert sorted(os.listdir(tmp_path / "default" / "range")) == ["_range_0", "_range_1"]


def test_resume_counts_epochs_and_restored_from(tmp_path, monkeypatch):
    monkeypatch.setenv("PADDLE_ACP_CHECKPOINT_URI", str(tmp_path))
    monkeypatch.setenv("PADDLE_ACP_ASYNC", "0")
    seen = []
    for e in acp.train_epoch_range(5, 0):
        assert acp.active_range().restored_from == acp.CONST_MEMORYINIT
        seen.append(e)
        if e == 2:
            break  # epoch 2 is not saved
    acp.simulate_restart()
    for e in acp.train_epoch_range(5, 0):
        assert acp.active_range().restored_from == acp.CONST_CHECKPOINT
        seen.append(e)
    assert seen == [0, 1, 2, 2, 3, 4]


def test_not_main_thread_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("PADDLE_ACP_CHECKPOINT_URI", str(tmp_path))
    errors = []

    def body():
        try:
            list(acp.train_epoch_range(2, 0))
        except acp.CheckpointError as exc:
            errors.append(str(exc))

    t = threading.Thread(target=body, name="worker-7")
    t.start()
    t.join(60)
    assert not t.is_alive()
    assert errors and "main thread" in errors[0] and "worker-7" in errors[0]


def test_nested_ranges_refused(tmp_path, monkeypatch):
    monkeypatch.setenv("PADDLE_ACP_CHECKPOINT_URI", str(tmp_path))
    with pytest.raises(acp.CheckpointError, match="nested"):
        for _ in acp.train_epoch_range(2, 0):
            for _ in acp.train_epoch_range(2, 0):
                pass


@pytest.mark.parametrize("bad, match", [(-1, "save_checkpoint_inter=-1"), ("often", "save_checkpoint_inter='often'")])
def test_bad_interval_argument(tmp_path, monkeypatch, bad, match):
    monkeypatch.setenv("PADDLE_ACP_CHECKPOINT_URI", str(tmp_path))
    with pytest.raises(acp.ConfigError, match=match):
        list(acp.train_epoch_range(2, bad))
    monkeypatch.delenv("PADDLE_ACP_CHECKPOINT_URI")
    with pytest.raises(acp.ConfigError, match=match):
        list(acp.train_epoch_range(2, bad))


def test_bad_max_epoch_num(tmp_path, monkeypatch):
    monkeypatch.setenv("PADDLE_ACP_CHECKPOINT_URI", str(tmp_path))
    with pytest.raises(acp.ConfigError, match="max_epoch_num"):
        list(acp.train_epoch_range("3", 0))


def test_path_under_a_file_names_variable(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("PADDLE_ACP_CHECKPOINT_URI", str(blocker / "ck"))
    with pytest.raises(acp.ConfigError, match="PADDLE_ACP_CHECKPOINT_URI.*not writable"):
        list(acp.train_epoch_range(1, 0))
    assert blocker.read_text() == "not a directory"


def test_unsupported_scheme(monkeypatch):
    monkeypatch.setenv("PADDLE_ACP_CHECKPOINT_URI", "gs://bucket/x")
    with pytest.raises(acp.ConfigError, match="unsupported scheme 'gs'"):
        list(acp.train_epoch_range(1, 0))


def test_trainer_one_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PADDLE_ACP_CHECKPOINT_URI", str(tmp_path / "ck"))
    monkeypatch.setenv("PADDLE_TRAINER_ID", "1")
    assert list(acp.train_epoch_range(3, 0)) == [0, 1, 2]
    assert not (tmp_path / "ck").exists()


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "paddle_acp", *args], capture_output=True, text=True, env=env, timeout=120)


def test_runner_rejects_bad_arguments(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("print('ran')\n")
    p = _cli("run", "--checkpoint", str(tmp_path / "ck"), "--interval", "-3", str(script))
    assert p.returncode == 2 and "--interval" in p.stderr and "ran" not in p.stdout
    p = _cli("run", "--checkpoint", str(tmp_path / "ck"), "--job-id", "../x", str(script))
    assert p.returncode == 2 and "--job-id='../x'" in p.stderr
    p = _cli("run", "--checkpoint", str(tmp_path / "ck"), str(tmp_path / "missing.py"))
    assert p.returncode == 2 and "does not exist" in p.stderr
    for empty in ("", "  "):  # before: checkpointing silently off ("... is not set")
        p = _cli("run", "--checkpoint", empty, str(script))
        assert p.returncode == 2 and f"--checkpoint={empty!r} is empty" in p.stderr and "ran" not in p.stdout


def test_runner_passes_arguments_and_exit_status(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("import sys\nprint('argv', sys.argv[1:], __name__)\nsys.exit(7)\n")
    p = _cli("run", "--checkpoint", str(tmp_path / "ck"), str(script), "--lr", "0.1", "x")
    assert p.returncode == 7
    assert "argv ['--lr', '0.1', 'x'] __main__" in p.stdout


@pytest.mark.parametrize("async_save", ["1", "0"])
def test_ended_range_frees_its_snapshot_arena_without_the_gc(tmp_path, monkeypatch, async_save):
    """The arena (as large as the whole state) is unmapped when the range ends, not when
    the cyclic garbage collector gets to the range: a 1.2 GB arena freed in the middle of
    the next range's first epoch cost that epoch seconds of training."""
    import gc
    import mmap
    import weakref

    import numpy as np
    import paddle
    from support.models import build

    paddle.enable_static()
    monkeypatch.setenv("PADDLE_ACP_CHECKPOINT_URI", str(tmp_path))
    monkeypatch.setenv("PADDLE_ACP_ASYNC", async_save)
    main, startup, extras = build("adam")
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    refs = []
    gc.disable()
    try:
        for _ in acp.train_epoch_range(3, 0):
            exe.run(main, feed=extras["feed"], fetch_list=[extras["loss"]])
            r = acp.active_range()
            r.persister.buffers.join()
            buf = r.persister.buffers.first.buf
            if buf is not None:  # a mapping of our own, as large as the state
                assert isinstance(buf.base.obj, mmap.mmap)
                refs.append(weakref.ref(buf.base.obj))
            del buf
        assert refs, "the range never prepared a snapshot arena"
        assert r.persister.buffers.first.buf is None
        # the default busy policy may skip a save that came due while the previous one was written
        assert r.persister.saver.stats.saves + r.persister.saver.stats.skipped == 3 and r.persister.saver.stats.failures == 0
        assert r.persister.saver.stats.saves >= 1
        del r
        assert all(ref() is None for ref in refs), "the arena outlived its range"
        # an ended range that is still hooked (restore pending) prepares no new arena
        assert acp.active_range() is None
    finally:
        gc.enable()
    assert np.isfinite(exe.run(main, feed=extras["feed"], fetch_list=[extras["loss"]])[0]).all()


# -- the runtime's process state and the range's open step -----------------------------------------
def test_errors_come_at_the_first_iteration_not_at_the_call(tmp_path, monkeypatch):
    """train_epoch_range(...) only builds the generator: storage, job marker and checkpoint are opened
    at the first iteration, which raises the configuration errors (as before the open step existed)."""
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("PADDLE_ACP_CHECKPOINT_URI", str(blocker / "ck"))
    loop = acp.train_epoch_range(2, 0)
    assert acp.active_range() is None
    with pytest.raises(acp.ConfigError, match="not writable"):
        next(loop)
    monkeypatch.setenv("PADDLE_ACP_CHECKPOINT_URI", str(tmp_path / "ck"))
    loop = acp.train_epoch_range(2, 0)
    assert not (tmp_path / "ck").exists()
    assert next(loop) == 0 and (tmp_path / "ck" / "default").is_dir()
    loop.close()


def test_range_constructor_does_no_io_and_open_does(tmp_path):
    from paddle_acp.config import from_env
    from paddle_acp.runtime.opening import open_storage_for
    from paddle_acp.runtime.range import EpochRange

    cfg = from_env({"PADDLE_ACP_CHECKPOINT_URI": str(tmp_path / "ck"), "PADDLE_JOB_ID": "j"})
    storage = open_storage_for(cfg)
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    r = EpochRange(3, "_range_0", cfg, storage, 0)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before  # nothing written
    assert r.restored_from == acp.CONST_MEMORYINIT and r.fence is None
    with pytest.raises(acp.ConfigError, match="max_epoch_num"):
        EpochRange("3", "_range_0", cfg, storage)
    opened = EpochRange.open(3, "_range_0", cfg, 0)
    try:
        assert (tmp_path / "ck" / "j").is_dir() and opened.fence is not None  # job marker and writer fence
    finally:
        opened.close()


def test_simulate_restart_resets_the_process_state(tmp_path, monkeypatch):
    from paddle_acp.runtime.state import STATE

    monkeypatch.setenv("PADDLE_ACP_CHECKPOINT_URI", str(tmp_path))
    for _ in acp.train_epoch_range(1, 0):
        assert STATE.active is acp.active_range() and STATE.hooked is STATE.active
    fence = next(iter(STATE.fences.values()))
    assert STATE.range_counter == 1 and STATE.marked_jobs and STATE.active is None
    failures = STATE.final_save_failures
    failures.append("x")
    acp.simulate_restart()
    assert (STATE.range_counter, STATE.fences, STATE.marked_jobs, STATE.active, STATE.hooked) == (0, {}, set(), None, None)
    assert failures == [] and STATE.final_save_failures is failures  # the list `paddle-acp run` holds
    for _ in acp.train_epoch_range(1, 0):
        pass
    assert next(iter(STATE.fences.values())).generation > fence.generation  # a restart takes a new generation


def _barrier_storage(root, fail_marker=False):
    """A local storage whose write of the job marker and creation of the fence's record each wait (10 s at
    most) for the other to be in flight: an open that makes them one after the other breaks the barrier."""
    from paddle_acp.errors import StorageError
    from paddle_acp.storage.local import LocalStorage

    barrier = threading.Barrier(2, timeout=10)

    class Storage(LocalStorage):
        fail = fail_marker  # whether a write of the marker fails (the test may change it)
        marker_writes = 0

        def write_bytes(self, path, data):
            if path.endswith("/job.json"):
                self.marker_writes += 1
                if self.marker_writes == 1:  # the open's: in flight while the fence is taken
                    barrier.wait()
                if self.fail:
                    raise StorageError("the marker could not be written (test)")
            return super().write_bytes(path, data)

        def create_exclusive(self, path, data):
            if "/writers/gen-" in path:
                barrier.wait()
            return super().create_exclusive(path, data)

    return Storage(str(root), str(root))


def test_the_job_marker_is_written_while_the_fence_is_taken(tmp_path):
    """Trainer 0's open writes the job marker while its fence's record is created (the marker a whole file write:
    ~0.4 s on HDFS 2.7): both are in flight at once, and the marker is on storage once the fence's first check
    (before anything is deleted or committed) passed."""
    from paddle_acp.config import from_env
    from paddle_acp.runtime.opening import open_io
    from paddle_acp.runtime.state import STATE

    acp.simulate_restart()
    cfg = from_env({"PADDLE_ACP_CHECKPOINT_URI": str(tmp_path / "ck"), "PADDLE_JOB_ID": "j"})
    storage = _barrier_storage(tmp_path / "ck")
    opened = open_io("_range_0", cfg, storage)
    assert opened.fence is not None and opened.fence.generation == 0
    opened.fence.check("delete something")
    assert (tmp_path / "ck" / "j" / "job.json").is_file() and (tmp_path / "ck" / "j" / "writers" / "gen-0").is_file()
    assert (storage.uri, "j") in STATE.marked_jobs
    acp.simulate_restart()


def test_a_job_marker_that_cannot_be_written_stops_every_delete_and_commit_until_it_is(tmp_path):
    from paddle_acp.config import from_env
    from paddle_acp.runtime.opening import open_io

    acp.simulate_restart()
    cfg = from_env({"PADDLE_ACP_CHECKPOINT_URI": str(tmp_path / "ck"), "PADDLE_JOB_ID": "j"})
    storage = _barrier_storage(tmp_path / "ck", fail_marker=True)
    opened = open_io("_range_0", cfg, storage)  # the marker is written in the background: no open waits for it
    for what in ("remove leftovers", "commit a checkpoint"):  # nothing is deleted or committed meanwhile
        with pytest.raises(acp.ConfigError, match="not reachable or not writable: the marker could not be written"):
            opened.fence.check(what)
    assert storage.marker_writes == 2 and not (tmp_path / "ck" / "j" / "job.json").exists()  # written again at each
    storage.fail = False  # the storage is back: the next check writes the marker, and passes
    opened.fence.check("commit a checkpoint")
    opened.fence.check("commit the next one")
    assert storage.marker_writes == 3 and (tmp_path / "ck" / "j" / "job.json").is_file()
    acp.simulate_restart()
    acp.simulate_restart()


class _Index:
    def __index__(self):
        return 2


@pytest.mark.parametrize("active", [False, True])
def test_range_arguments_are_checked_alike_with_checkpointing_on_or_off(tmp_path, monkeypatch, active):
    """Before: off, '3', 3.0 or None raised a raw TypeError from inside; np.int64(3) worked off, ConfigError on."""
    import numpy as np

    for i, (good, n) in enumerate(((np.int64(3), 3), (np.int32(2), 2), (np.uint8(1), 1), (_Index(), 2), (3, 3))):
        if active:  # (a location each: one range's checkpoints would make the next resume past its end)
            monkeypatch.setenv("PADDLE_ACP_CHECKPOINT_URI", str(tmp_path / f"ck{i}"))
        assert list(acp.train_epoch_range(good, 0)) == list(range(n)), good
        acp.simulate_restart()
    for bad in ("3", 3.0, None, True, [3], np.float64(3)):
        with pytest.raises(acp.ConfigError, match=r"max_epoch_num=.* must be an integer"):
            list(acp.train_epoch_range(bad, 0))
    for bad in ("soon", -1, float("nan"), [0]):
        with pytest.raises(acp.ConfigError, match="save_checkpoint_inter="):
            list(acp.train_epoch_range(2, bad))
    assert acp.active_range() is None
