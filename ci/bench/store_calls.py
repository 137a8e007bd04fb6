"""Benchmark (on demand): one call to Paddle's TCP store from another process, with and without TCP_NODELAY.

A store of ours is hosted in this process (as rank 0's is); a second process (as rank 1) opens it through
``paddle_acp.adapter.store.open_store`` (which sets TCP_NODELAY on its connection) and times ``add``, ``get`` and a
part's arrival (``set`` + two ``add``) in rounds, alternating the option off (Paddle's own default) and on, on the
same connection in the same process. Reported: the median per call of each, and off / on.

    python ci/bench/store_calls.py [--calls 50] [--rounds 3] [--key KEY | --json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "tests"))
sys.path.insert(0, HERE)
import results_io  # noqa: E402


def client(port: int, calls: int, rounds: int) -> dict:
    from paddle_acp.adapter.store import StoreEndpoint, _sockets_to, open_store

    store = open_store(StoreEndpoint("127.0.0.1", port, "MASTER_ADDR"), 1, 2, 60)
    fds = _sockets_to(port)
    store.set("v", b"x" * 3000)

    def nodelay(on: bool) -> None:
        for fd in fds:
            with socket.socket(fileno=os.dup(fd)) as sk:
                sk.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, int(on))

    ops = {"add": lambda: store.add("k", 1), "get": lambda: store.get("v"),
           "arrival": lambda: (store.set("n", b"m" * 2000), store.add("n#n", 1), store.add("a", 1))}
    out: dict = {f"{op}_{mode}": [] for op in ops for mode in ("off", "on")}
    for _ in range(rounds):
        for mode in ("off", "on"):
            nodelay(mode == "on")
            for op, fn in ops.items():
                ts = []
                for _ in range(calls):
                    t = time.perf_counter()
                    fn()
                    ts.append(time.perf_counter() - t)
                out[f"{op}_{mode}"].append(statistics.median(ts))
    store.add("done", 1)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=3)
    results_io.add_args(ap, __file__)
    ap.add_argument("--client", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.client:
        with open(a.out, "w") as f:
            json.dump(client(a.client, a.calls, a.rounds), f)
        return 0
    from support.coord import free_port

    from paddle_acp.adapter.store import StoreEndpoint, open_store

    port = free_port()
    out = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"store_calls_{os.getpid()}.json")
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--client", str(port), "--out", out,
                             "--calls", str(a.calls), "--rounds", str(a.rounds)])
    store = open_store(StoreEndpoint("127.0.0.1", port, "MASTER_ADDR"), 0, 2, 60)
    if proc.wait(timeout=900) != 0:
        print("store_calls: the client process failed", file=sys.stderr)
        return 1
    store.add("done", 0)
    with open(out) as f:
        got = json.load(f)
    os.unlink(out)
    result = {"command": "python ci/bench/store_calls.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "calls": a.calls, "rounds": a.rounds,
              "per_call_s": {k: [round(x, 6) for x in v] for k, v in got.items()}}
    for op in ("add", "get", "arrival"):
        off, on = statistics.median(got[f"{op}_off"]), statistics.median(got[f"{op}_on"])
        result[op] = {"off_ms": round(off * 1e3, 3), "on_ms": round(on * 1e3, 3), "off_over_on": round(off / on, 1)}
        print(f"{op:8s} without TCP_NODELAY {off * 1e3:8.3f} ms   with {on * 1e3:7.3f} ms   ratio {off / on:7.1f}x")
    print(f"wrote {results_io.write(result, __file__, a.json, a.key)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
