"""Split rank 0's persists of a benchmark run into their steps, from the simulated store's call trace.

Run a benchmark with ``ACP_SIM_TRACE=<dir>`` in the ranks' environment (``ci/bench/sim_training.py ... --env
ACP_SIM_TRACE=<dir>``: ci/bench/simstore.py then appends one line per storage call of each process to
``<dir>/trace-<rank>-<pid>.jsonl``), then ``python ci/bench/persist_trace.py <dir>``. For each checkpoint
position it prints, relative to rank 0's first call of that save (the saver starting on it):

* rank 0's own part: its data upload (``write_image``) and the rename that commits the part;
* each other rank's part: when its upload began and ended and when its rename landed, and when
  rank 0 first read its manifest (noticed it);
* rank 0's commit: its first call (handed to the committer), the ``global.json`` rename (the
  commit), the poll listings of the position, the storage calls made by rank 0 up to then;
* what the committer's thread does after the commit, before its next position (retention).

For benchmarks only: it reads nothing but the trace files.
"""

import collections
import glob
import json
import os
import re
import sys

POS = re.compile(r"/(ckpt-e\d+(?:-s\d+)?)(?:/|$)")
PART = re.compile(r"/rank-(\d+)(?:\.tmp-[^/]*)?(?:/|$)")


def key(name):
    return tuple(int(x) for x in re.findall(r"\d+", name))


def load(directory):
    rows = []
    for path in glob.glob(os.path.join(directory, "trace-*.jsonl")):
        rank = int(os.path.basename(path).split("-")[1])
        for line in open(path):
            d = json.loads(line)
            d["rank"] = rank
            rows.append(d)
    rows.sort(key=lambda d: d["t0"])
    return rows


def split(rows):
    """Per position: (its name, the lines printed)."""
    by_pos = collections.OrderedDict()
    for d in rows:
        m = POS.search(d["path"])
        if m:
            by_pos.setdefault(m.group(1), []).append(d)
    out = []
    for name, calls in by_pos.items():
        r0 = [d for d in calls if d["rank"] == 0]
        saver = [d for d in r0 if d["thread"] != "paddle-acp-committer"]
        if not saver:
            continue
        t = saver[0]["t0"]
        lines = []

        def at(x, t=t):
            return f"{x - t:+7.3f}"

        parts = {}
        for d in calls:
            m = PART.search(d["path"])
            if m is None or d["thread"] == "paddle-acp-committer":
                continue
            p = parts.setdefault(int(m.group(1)), {})
            if d["op"] == "write_image":
                p["up"] = (d["t0"], d["t1"])
            elif d["op"] == "rename":
                p["landed"] = d["t1"]
        committer = [d for d in rows if d["rank"] == 0 and d["thread"] == "paddle-acp-committer" and d["t0"] >= t]
        gl = next((d for d in committer if d["op"] == "rename" and d["path"].endswith(f"{name}/global.json.tmp")
                   or (d["op"] == "rename" and f"{name}/global.json" in d["path"])), None)
        noticed = {}
        for d in committer:
            m = PART.search(d["path"])
            if d["op"] == "open_input" and m and d["path"].endswith("manifest.json") and f"/{name}/" in d["path"]:
                noticed.setdefault(int(m.group(1)), d["t0"])
        began = parts.get(0, {}).get("landed")  # rank 0's commit begins once its own part is in place
        for k in sorted(parts):
            p = parts[k]
            up = p.get("up")
            late = "landed" in p and began is not None and p["landed"] > began
            lines.append(f"  rank {k}: upload {at(up[0]) if up else '   -   '} .. {at(up[1]) if up else '   -   '}"
                         f" ({(up[1] - up[0]) if up else 0:.3f} s), landed {at(p['landed']) if 'landed' in p else '-'}"
                         + (f", noticed by rank 0 {at(noticed[k])} (+{noticed[k] - p['landed']:.3f} s"
                            + (")" if late or k == 0 else ", landed before rank 0's own part)")
                            if k in noticed and "landed" in p else ""))
        if gl is not None:
            first = next((d for d in committer if d["t0"] >= parts.get(0, {}).get("landed", t)), None)
            in_commit = [d for d in committer if first is not None and first["t0"] <= d["t0"] <= gl["t1"]]
            polls = [d for d in in_commit if d["op"] == "listdir" and d["path"].endswith(name)]
            lines.append(f"  commit: handed over {at(first['t0'])}, global.json renamed {at(gl['t1'])}; "
                         f"{len(in_commit)} calls on the committer ({len(polls)} listings of the position), "
                         f"{(gl['t1'] - first['t0']):.3f} s")
            after = []  # the committer's calls after the commit, up to its next position's (retention)
            for d in committer:
                m = POS.search(d["path"])
                if d["t0"] <= gl["t1"]:
                    continue
                if m and m.group(1) != name and key(m.group(1)) > key(name):
                    break
                after.append(d)
            if after:
                lines.append(f"  then on the committer (retention): {len(after)} calls, "
                             f"{after[-1]['t1'] - gl['t1']:.3f} s ({', '.join(sorted({d['op'] for d in after}))})")
        out.append((name, lines))
    return out


def main(argv):
    if len(argv) != 1 or argv[0] in ("-h", "--help"):
        raise SystemExit(__doc__)
    for name, lines in split(load(argv[0])):
        print(name)
        for line in lines:
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
