"""A benchmark's one results file: ``ci/bench/results/<bench>.json``, named after the script.

The file maps a key to each recorded run (a run's JSON document, as the benchmark writes it); the runs
recorded before the benchmarks moved here (issue 43) are under keys named after their old files
(e.g. ``bench_agree_coord_results``). By default a run is added to its benchmark's file under ``--key``
(default: ``run-<UTC start>``), every other run kept; ``--json FILE`` writes the run alone to FILE
instead (a smoke run, a scratch measurement). docs/performance.md names the file and key of each figure.
"""
import argparse
import json
import os
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
RESULTS = os.path.join(HERE, "results")


def results_file(script: str) -> str:
    """``ci/bench/results/<bench>.json`` of the benchmark ``script`` (its path or name)."""
    return os.path.join(RESULTS, os.path.splitext(os.path.basename(script))[0] + ".json")


def add_args(ap: argparse.ArgumentParser, script: str) -> None:
    """``--json`` and ``--key`` of a benchmark writing its run through :func:`write`."""
    rel = os.path.relpath(results_file(script), REPO)
    ap.add_argument("--json", default=None, metavar="FILE",
                    help=f"write this run alone to FILE (default: add it to {rel} under --key)")
    ap.add_argument("--key", default=None,
                    help=f"this run's key in {rel} (default: run-<UTC start>, e.g. run-2026-12-06T20:50Z)")


def write(doc: dict, script: str, json_path=None, key=None) -> str:
    """Record one run ``doc`` of the benchmark ``script``; returns where it went.

    ``json_path`` given (another file than the benchmark's own) and no ``key``: the run alone, to that
    file. Otherwise the run is added under ``key`` (default: ``run-<UTC now>``) to ``json_path`` or the
    benchmark's results file, the runs already there kept."""
    own = results_file(script)
    if json_path and key is None and os.path.abspath(json_path) != own:
        with open(json_path, "w") as f:
            json.dump(doc, f, indent=2)
        return json_path
    path = json_path or own
    runs: dict = {}
    if os.path.exists(path):
        with open(path) as f:
            runs = json.load(f)
    key = key or time.strftime("run-%Y-%m-%dT%H:%MZ", time.gmtime())
    runs[key] = doc
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(runs, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)
    return f"{path} [{key}]"
