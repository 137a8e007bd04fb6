"""The figures of ci/bench/local_costs.py, measured in a child process per IR (the IR is fixed at paddle import).

Every figure is a ratio of two things measured side by side in this process, in paired rounds
(A and B back to back); ci/bench/local_costs.py takes the medians, prints the table and stores the JSON.
"""

import os
import shutil
import statistics
import tempfile
import time


def log(msg):
    print(msg, flush=True)


def median_ratio(pairs):
    return statistics.median(a / b for a, b in pairs)


def memory_tools():
    """alloc_buffer, chunked, copy_job, run_parallel, tensor_view."""
    from paddle_acp.adapter.tensors import tensor_view
    from paddle_acp.format.engine.arena import alloc_buffer, chunked, copy_job, run_parallel

    return alloc_buffer, chunked, copy_job, run_parallel, tensor_view


def evict(path):
    """Drop a file from the page cache so that reads of it are cold, like after a restart."""
    if not os.path.exists(path):
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def fsync_tree(path):
    """fsync every file under ``path`` and the directories: Paddle's save made durable."""
    for root, _dirs, files in os.walk(path):
        for name in files:
            fd = os.open(os.path.join(root, name), os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def tree_size(path):
    return sum(os.path.getsize(os.path.join(r, f)) for r, _d, fs in os.walk(path) for f in fs)


def bench_one(args):
    """Runs in a subprocess per IR (the IR is fixed at paddle import)."""
    import numpy as np
    import paddle

    import paddle_acp as acp
    from paddle_acp.runtime import api, hook

    paddle.enable_static()
    legacy = os.environ.get("FLAGS_enable_pir_api") == "0"
    ir = "legacy" if legacy else "pir"
    work = tempfile.mkdtemp(prefix="acp-bench-", dir=args.dir)
    res = {"ir": ir}
    only = {int(x) for x in args.only.split(",")} if args.only else {1, 2, 3, 4, 5}

    def want(figure):
        return figure in only
    width = max(64, int((args.params / 2) ** 0.5))  # two width x width layers

    def build(width, layers=2):
        main, startup = paddle.static.Program(), paddle.static.Program()
        with paddle.static.program_guard(main, startup):
            x = paddle.static.data("x", [None, width], "float32")
            h = x
            for _ in range(layers):
                h = paddle.static.nn.fc(h, width)
            loss = paddle.mean(h * h)
            paddle.optimizer.Adam(1e-4).minimize(loss)
        return main, startup, loss

    main, startup, loss = build(width)
    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(startup)
    feed = {"x": np.random.rand(2, width).astype("float32")}
    exe.run(main, feed=feed, fetch_list=[loss])  # create Adam state
    scope = paddle.static.global_scope()
    from paddle_acp.adapter.programs import program_info

    names = program_info(main).persistables
    alloc_buffer, chunked, copy_job, run_parallel, tensor_view = memory_tools()
    state_bytes = sum(tensor_view(scope.find_var(n).get_tensor())[1].nbytes for n in names)
    res["state_bytes"] = state_bytes
    log(f"[{ir}] model: 2 x fc({width}x{width}) + Adam, state {state_bytes / 1e9:.2f} GB")

    def raw_write(path):
        """The same bytes, already in host memory, written sequentially + fsync."""
        arrays = [tensor_view(scope.find_var(n).get_tensor())[1] for n in names]
        t0 = time.perf_counter()
        with open(path, "wb") as f:
            for a in arrays:
                f.write(memoryview(a).cast("B"))
            f.flush()
            os.fsync(f.fileno())
        return time.perf_counter() - t0

    def paddle_save(path, durable=False):
        """Paddle's own save path: through the page cache, or made durable (+ fsync of its files)."""
        t0 = time.perf_counter()
        if legacy:
            # what Paddle's CheckpointSaver(PaddleModel) does for each program: save_persistables
            from paddle.distributed.io import save_persistables

            save_persistables(exe, path, main)
        else:
            vs = [v for v in main.list_vars() if v.persistable]
            paddle.static.save_vars(exe, path, main, vars=vs, filename="all")
        if durable:
            fsync_tree(path)
        return time.perf_counter() - t0

    def fresh(p):
        shutil.rmtree(p, ignore_errors=True)
        return p

    # -- 1 and 2: stall and sync throughput, through the real train_epoch_range ---------------
    def acp_epochs(async_save, epochs, steps, hold=0.0):
        uri = fresh(os.path.join(work, "acp"))
        os.environ.update(PADDLE_ACP_CHECKPOINT_URI=uri, PADDLE_ACP_ASYNC="1" if async_save else "0", PADDLE_ACP_MAX_TO_KEEP="1")
        api.reset()
        stalls = []  # steady state: the first save (arena set-up) and the last (final commit) are dropped
        it = acp.train_epoch_range(epochs, save_checkpoint_inter=0)
        next(it)
        for _e in range(epochs):
            for _ in range(steps):
                exe.run(main, feed=feed, fetch_list=[loss])
            if hold:
                time.sleep(hold)  # let the background save finish: measure the stall alone
            t0 = time.perf_counter()
            try:
                next(it)
            except StopIteration:
                pass
            stalls.append(time.perf_counter() - t0)
        os.environ.pop("PADDLE_ACP_CHECKPOINT_URI")
        return stalls[1:-1] if len(stalls) > 2 else stalls

    floor_buf = alloc_buffer(state_bytes) if want(1) else None

    def bare_copy():
        """The floor of any snapshot: one memcpy of the state on two threads, nothing else."""
        jobs, pos = [], 0
        for n in names:
            _dt, v = tensor_view(scope.find_var(n).get_tensor())
            chunked(floor_buf[pos:pos + v.nbytes], v, jobs)
            pos += v.nbytes
        t0 = time.perf_counter()
        run_parallel(copy_job, jobs)
        return time.perf_counter() - t0

    if want(1) or want(2):
        hold = max(1.0, state_bytes / 0.3e9)
        stall_pairs_paddle, stall_pairs_raw, stall_pairs_copy, sync_pairs, durable_pairs = [], [], [], [], []
        sync_times = []
        for r in range(args.rounds):
            stall = statistics.median(acp_epochs(True, 4, 1, hold=hold))
            t_copy = statistics.median(bare_copy() for _ in range(3))
            t_paddle = paddle_save(fresh(os.path.join(work, "paddle")))
            t_durable = paddle_save(fresh(os.path.join(work, "paddle")), durable=True)
            t_raw = raw_write(os.path.join(work, "raw.bin"))
            stall_pairs_paddle.append((stall, t_paddle))
            durable_pairs.append((stall, t_durable))
            stall_pairs_raw.append((stall, t_raw))
            stall_pairs_copy.append((stall, t_copy))
            sync = statistics.median(acp_epochs(False, 4, 1))
            t_raw2 = raw_write(os.path.join(work, "raw.bin"))
            sync_pairs.append((t_raw2, sync))
            sync_times.append(sync)  # throughput ratio = raw time / our time
            log(f"[{ir}] round {r}: stall {stall:.3f}s, bare memcpy {t_copy:.3f}s, paddle save {t_paddle:.3f}s (+fsync {t_durable:.3f}s), raw write+fsync {t_raw:.3f}s, sync save {sync:.3f}s, raw {t_raw2:.3f}s")
        res["stall_vs_paddle"] = median_ratio(stall_pairs_paddle)
        res["stall_vs_paddle_durable"] = median_ratio(durable_pairs)
        res["paddle_durable_save_seconds"] = statistics.median(p[1] for p in durable_pairs)
        res["stall_vs_raw_write"] = median_ratio(stall_pairs_raw)
        res["stall_vs_bare_memcpy"] = median_ratio(stall_pairs_copy)
        res["bare_memcpy_seconds"] = statistics.median(p[1] for p in stall_pairs_copy)
        res["stall_seconds"] = statistics.median(p[0] for p in stall_pairs_paddle)
        res["paddle_save_seconds"] = statistics.median(p[1] for p in stall_pairs_paddle)
        res["sync_save_throughput_vs_raw"] = median_ratio(sync_pairs)
        res["sync_save_seconds"] = statistics.median(sync_times)
    floor_buf = None  # scaffolding: not mapped during later figures

    # -- 3: restore vs raw read ---------------------------------------------------------------
    if want(3):
        if not (want(1) or want(2)):
            acp_epochs(False, 2, 1)  # a checkpoint to restore, and the same bytes raw
            raw_write(os.path.join(work, "raw.bin"))
        from paddle_acp.adapter.tensors import write_program
        from paddle_acp.format.checkpoints.multirank import GlobalCheckpointer
        from paddle_acp.format.checkpoints.part_reader import PartReader
        from paddle_acp.format.checkpoints.restart import load_newest
        from paddle_acp.storage import open_storage

        uri = os.path.join(work, "acp")
        ck = PartReader(open_storage(uri), "default", "_range_0")
        bufs = [np.ones_like(tensor_view(scope.find_var(n).get_tensor())[1]) for n in names]  # preallocated, touched
        restore_pairs = []
        import glob

        def restore_acp():
            t0 = time.perf_counter()
            loaded = load_newest(ck, GlobalCheckpointer(ck.storage, ck.job_id, ck.range_name, 0, 1), None)
            key = loaded.manifest.programs[0].key
            write_program(loaded, key, scope, paddle.CPUPlace())  # what a restarted job does at first run
            return time.perf_counter() - t0

        def read_plus_memcpy():
            """The floor of a verified restore: a cold read of the same bytes into preallocated
            buffers, then one memcpy of them into the scope's tensors (two threads, as the floor of
            the stall). Returns (read seconds, read + memcpy seconds)."""
            t0 = time.perf_counter()
            with open(os.path.join(work, "raw.bin"), "rb") as f:
                for b in bufs:
                    f.readinto(memoryview(b).cast("B"))
            t_read = time.perf_counter() - t0
            jobs = []
            for n, b in zip(names, bufs):
                _dt, v = tensor_view(scope.find_var(n).get_tensor())
                chunked(v, b, jobs)
            run_parallel(copy_job, jobs)
            return t_read, time.perf_counter() - t0

        files = glob.glob(os.path.join(uri, "default", "range", "_range_0", "ckpt-*", "rank-0", "tensors.bin")) + [os.path.join(work, "raw.bin")]
        floor_pairs, read_times = [], []
        for r in range(args.rounds):
            for p in files:
                evict(p)
            if r % 2 == 0:  # ABBA: neither gets a systematic edge from the disk's state
                t_acp = restore_acp()
                t_read, t_floor = read_plus_memcpy()
            else:
                t_read, t_floor = read_plus_memcpy()
                t_acp = restore_acp()
            restore_pairs.append((t_read, t_acp))
            floor_pairs.append((t_acp, t_floor))
            read_times.append(t_read)
            log(f"[{ir}] round {r}: restore {t_acp:.3f}s, raw cold read {t_read:.3f}s, read + memcpy {t_floor:.3f}s")
        res["restore_throughput_vs_raw_read"] = median_ratio(restore_pairs)
        res["restore_vs_read_plus_memcpy"] = median_ratio(floor_pairs)
        res["restore_seconds"] = statistics.median(p[0] for p in floor_pairs)
        res["read_plus_memcpy_seconds"] = statistics.median(p[1] for p in floor_pairs)
        # fast-disk rounds: the raw read within 25% of the fastest one of this run
        fast = [pr for pr, t in zip(floor_pairs, read_times) if t <= 1.25 * min(read_times)]
        res["restore_vs_read_plus_memcpy_fast_disk"] = median_ratio(fast)
        res["restore_fast_disk_rounds"] = len(fast)
        del bufs

    # -- 4: hook overhead ---------------------------------------------------------------------
    if want(4):
        with paddle.utils.unique_name.guard("tiny_"):
            tiny_main, tiny_startup, tiny_loss = build(8, layers=1)
        tscope = paddle.static.Scope()
        exe.run(tiny_startup, scope=tscope)
        tfeed = {"x": np.ones((2, 8), "float32")}
        os.environ.update(PADDLE_ACP_CHECKPOINT_URI=fresh(os.path.join(work, "hook")), PADDLE_ACP_ASYNC="0")
        api.reset()
        it = acp.train_epoch_range(1, save_checkpoint_inter=10**6)
        next(it)
        # fine-grained interleaving (blocks of 50 runs, many rounds): run-to-run drift cancels out
        block, rounds = 50, (10 if args.quick else 400)
        hook_pairs = []
        def block_time(hooked):
            (hook.install if hooked else hook.uninstall)()
            t0 = time.perf_counter()
            for _ in range(block):
                exe.run(tiny_main, feed=tfeed, fetch_list=[tiny_loss], scope=tscope)
            return time.perf_counter() - t0

        for r in range(rounds):
            if r % 2 == 0:  # ABBA order: whichever block runs first in a pair gets no systematic edge
                with_hook = block_time(True)
                without = block_time(False)
            else:
                without = block_time(False)
                with_hook = block_time(True)
            hook_pairs.append((with_hook, without))
        hook.install()
        # the hook's own cost, without Paddle's run-to-run noise: the same wrapper around a no-op
        from paddle.base.executor import Executor

        real = Executor.run.__paddle_acp_original__
        hook.uninstall()

        def noop(self, *a, **k):
            return None

        Executor.run = noop
        hook.install()  # wraps the no-op exactly as it wraps Paddle's run
        wrapped = Executor.run
        calls = 20000 if args.quick else 200000
        costs = []
        for _ in range(5):
            t0 = time.perf_counter()
            for _ in range(calls):
                noop(exe, tiny_main, feed=tfeed, fetch_list=[tiny_loss], scope=tscope)
            bare = time.perf_counter() - t0
            t0 = time.perf_counter()
            for _ in range(calls):
                wrapped(exe, tiny_main, feed=tfeed, fetch_list=[tiny_loss], scope=tscope)
            costs.append((time.perf_counter() - t0 - bare) / calls)
        hook.uninstall()
        Executor.run = real
        hook.install()
        it.close()
        os.environ.pop("PADDLE_ACP_CHECKPOINT_URI")
        res["hook_overhead"] = median_ratio(hook_pairs) - 1.0
        res["hook_us_per_run_without"] = statistics.median(p[1] for p in hook_pairs) / block * 1e6
        res["hook_us_per_call"] = statistics.median(costs) * 1e6

    # -- 5: end-to-end ------------------------------------------------------------------------
    if want(5):
        def training_run(on, epochs, steps):
            """Wall time of the run, and the part of it spent at epoch boundaries (in the range's
            own code: the stalls and the final commit; the rest is training steps)."""
            if on:
                uri = (f"{args.e2e_uri}/e2e-{os.getpid()}-{time.time_ns()}" if args.e2e_uri
                       else fresh(os.path.join(work, "e2e")))
                os.environ.update(PADDLE_ACP_CHECKPOINT_URI=uri, PADDLE_ACP_ASYNC="1", PADDLE_ACP_MAX_TO_KEEP="2")
            else:
                os.environ.pop("PADDLE_ACP_CHECKPOINT_URI", None)
            api.reset()
            boundaries = 0.0
            t0 = time.perf_counter()
            it = iter(acp.train_epoch_range(epochs, save_checkpoint_inter=0))
            while True:
                tb = time.perf_counter()
                try:
                    next(it)
                except StopIteration:
                    boundaries += time.perf_counter() - tb
                    break
                boundaries += time.perf_counter() - tb
                for _ in range(steps):
                    exe.run(main, feed=feed, fetch_list=[loss])
            return time.perf_counter() - t0, boundaries  # the range waits for its last checkpoint to commit

        # steps per epoch so that an epoch lasts ~the time a checkpoint takes to persist, times 10
        step_times = []
        for _ in range(7):
            t0 = time.perf_counter()
            exe.run(main, feed=feed, fetch_list=[loss])
            step_times.append(time.perf_counter() - t0)
        step = statistics.median(step_times)  # one slow step must not shorten every epoch
        steps = max(2, int(args.epoch_seconds / step))
        e2e_pairs, split = [], []
        for r in range(args.e2e_rounds):
            if r % 2 == 0:  # ABBA order, as for the hook
                on, on_b = training_run(True, args.e2e_epochs, steps)
                off, off_b = training_run(False, args.e2e_epochs, steps)
            else:
                off, off_b = training_run(False, args.e2e_epochs, steps)
                on, on_b = training_run(True, args.e2e_epochs, steps)
            e2e_pairs.append((on, off))
            # where the difference went: blocked at boundaries, or slower steps (background contention)
            split.append((on_b - off_b, (on - on_b) - (off - off_b)))
            log(f"[{ir}] round {r}: training with checkpoints {on:.2f}s, without {off:.2f}s ({steps} steps/epoch); "
                f"of the difference: {split[-1][0]:.2f}s blocked at epoch boundaries, {split[-1][1]:+.2f}s in the steps")
        res["end_to_end_overhead"] = median_ratio(e2e_pairs) - 1.0
        res["end_to_end_rounds"] = [on / off - 1.0 for on, off in e2e_pairs]
        # training time lost per checkpoint, one-time costs included: the overhead at other epoch lengths
        res["seconds_lost_per_checkpoint"] = statistics.median((on - off) / args.e2e_epochs for on, off in e2e_pairs)
        res["seconds_blocked_at_boundaries_per_run"] = statistics.median(b for b, _ in split)
        res["seconds_steps_slower_per_run"] = statistics.median(d for _, d in split)
        res["epoch_seconds"] = statistics.median(off for _on, off in e2e_pairs) / args.e2e_epochs  # as run
    shutil.rmtree(work, ignore_errors=True)
    return res


