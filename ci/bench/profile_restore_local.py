#!/usr/bin/env python
"""Where a warm local restore's time goes, per candidate path (issue 44): the passes over a data file in
the page cache that a restore could make, each timed alone in one process (best and median of ``--reps``).

- ``verify, mapped windows, T threads``: today's verification (8 MB windows mapped, ``MADV_POPULATE_READ``,
  checksummed in place, unmapped) on 1 and 2 threads;
- ``copy: preadv into the tensors, 2 threads``: today's copy into the scope's (populated) tensors;
- ``one pass into the arena``: the alternative of landing each chunk in a fresh snapshot arena
  (``MADV_POPULATE_WRITE`` then ``preadv``) and checksumming it while hot, then a two-thread memcpy into the
  tensors; ``arena population alone``: what its fresh pages cost;
- the floor's parts (ci/bench/restore.py): ``read into a touched buffer`` (16 MB reads) and ``memcpy, 2 threads``.

    python ci/bench/profile_restore_local.py --mb 300,1200 [--reps 5] [--dir /tmp]
"""
from __future__ import annotations

import argparse
import mmap
import os
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the repository
from paddle_acp.format.engine.arena import Arena, populate_pages  # noqa: E402
from paddle_acp.format.manifest import checksum_function  # noqa: E402

CRC = checksum_function(3)
WINDOW = 8 << 20
COPY = 32 << 20


def profile(path: str, size: int, reps: int) -> dict:
    fd = os.open(path, os.O_RDONLY)
    two = ThreadPoolExecutor(2)
    tensors = np.ones(size, np.uint8)  # the scope's tensors: populated
    touched = np.ones(size, np.uint8)

    def window_crc(pos: int) -> int:
        n = min(WINDOW, size - pos)
        w = mmap.mmap(fd, n, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ, offset=pos)
        w.madvise(getattr(mmap, "MADV_POPULATE_READ", 22), 0, n)
        a = np.frombuffer(w, np.uint8)
        c = CRC(a, 0)
        del a
        w.close()
        return c

    def verify(threads: int) -> None:
        if threads == 1:
            for pos in range(0, size, WINDOW):
                window_crc(pos)
        else:
            list(two.map(window_crc, range(0, size, WINDOW)))

    def pread(buf: np.ndarray, pos: int, n: int) -> None:
        mv, got = memoryview(buf)[pos:pos + n], 0
        while got < n:
            got += os.preadv(fd, [mv[got:]], pos + got)

    def copy_preadv() -> None:
        list(two.map(lambda p: pread(tensors, p, min(COPY, size - p)), range(0, size, COPY)))

    def memcpy2(dst: np.ndarray, src: np.ndarray) -> None:
        list(two.map(lambda p: np.copyto(dst[p:p + COPY], src[p:p + COPY]), range(0, size, COPY)))

    def one_pass() -> None:
        arena = Arena()
        arena.start(size)
        arena.cancel()
        buf = arena.buf
        assert buf is not None
        futs = []
        for pos in range(0, size, WINDOW):
            n = min(WINDOW, size - pos)
            populate_pages(buf[pos:pos + n])
            pread(buf, pos, n)
            futs.append(two.submit(CRC, buf[pos:pos + n], 0))
        for f in futs:
            f.result()
        memcpy2(tensors, buf[:size])
        arena.release()

    def populate_only() -> None:
        arena = Arena()
        arena.start(size)
        arena.cancel()
        assert arena.buf is not None
        populate_pages(arena.buf[:size])
        arena.release()

    def floor_read() -> None:
        for pos in range(0, size, 16 << 20):
            pread(touched, pos, min(16 << 20, size - pos))

    cases = {
        "verify, mapped windows, 1 thread": lambda: verify(1),
        "verify, mapped windows, 2 threads": lambda: verify(2),
        "copy: preadv into the tensors, 2 threads": copy_preadv,
        "one pass into the arena (populate, preadv, CRC), then memcpy": one_pass,
        "arena population alone": populate_only,
        "floor: read into a touched buffer": floor_read,
        "floor: memcpy, 2 threads": lambda: memcpy2(tensors, touched),
    }
    out = {}
    for name, fn in cases.items():
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        out[name] = {"best_ms": round(min(times) * 1e3, 1), "median_ms": round(statistics.median(times) * 1e3, 1)}
        print(f"[profile_restore_local] {size >> 20} MB {name}: best {out[name]['best_ms']} ms, "
              f"median {out[name]['median_ms']} ms", flush=True)
    os.close(fd)
    two.shutdown()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mb", default="300,1200")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    for mb in [int(x) for x in args.mb.split(",")]:
        size = mb << 20
        fd, path = tempfile.mkstemp(prefix="acp-profile-restore-", dir=args.dir)
        try:
            rng = np.random.default_rng(mb)
            for pos in range(0, size, 64 << 20):
                os.write(fd, rng.integers(0, 256, min(64 << 20, size - pos), dtype=np.uint8).tobytes())
            os.fsync(fd)
            with open(path, "rb", buffering=0) as f:  # warm: in the page cache
                while f.read(16 << 20):
                    pass
            profile(path, size, args.reps)
        finally:
            os.close(fd)
            os.unlink(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
