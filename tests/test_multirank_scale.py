"""A rank's restart costs the same storage calls at any world size (issue 28 item 4): it reads the
global manifest and only the parts it loads. Counted by a pass-through wrapper around a real
local storage (tests/support/counting.py), Paddle-free."""

import pytest
from support.counting import counting, total
from test_multirank import JOB, RANGE, save_all

from paddle_acp.format.checkpointer import Checkpointer
from paddle_acp.format.fencing import Fence
from paddle_acp.format.multirank import GlobalCheckpointer
from paddle_acp.format.restart import load_newest
from paddle_acp.storage import open_storage

MAX_RESTART_CALLS = 20  # the target per rank


def restart_calls(root, rank, world, mode):
    """The storage calls of rank ``rank``'s restart in a job of ``world`` ranks: its fence, the
    checkpoint it resumes from (found, verified, loaded) and the clean-up of what is newer."""
    st = counting(open_storage(str(root)))
    if rank == 0:
        Checkpointer(st, JOB, RANGE).write_job_marker()
    fence = Fence.take(st, JOB, rank)
    gck = GlobalCheckpointer(st, JOB, RANGE, rank, world, 3, 5.0, fence)
    loaded = load_newest(Checkpointer(st, JOB, RANGE, 3, fence), gck, mode)
    assert loaded is not None and loaded.global_manifest.name == "ckpt-e1"
    assert int(loaded.arrays[("fp-shared", "rank")][0]) == (rank if mode == "per-rank" else 0)
    gck.resume_from(loaded)
    gck.discard_newer(loaded.position_key)
    loaded.close()
    return total(st), dict(st.calls)


@pytest.mark.parametrize("mode", ["per-rank", "replicated"])
def test_a_ranks_restart_costs_the_same_storage_calls_at_any_world_size(tmp_path, mode):
    got = {}
    for world in (4, 16, 64):
        root = tmp_path / f"w{world}"
        for e in (0, 1):
            assert save_all(root, world, e, mode=mode).committed is True
        for rank in (0, 1, world - 1):
            got[(world, rank)] = restart_calls(root, rank, world, mode)
    for rank in ("first", "second", "last"):
        per_world = {w: got[(w, {"first": 0, "second": 1, "last": w - 1}[rank])] for w in (4, 16, 64)}
        counts = {w: n for w, (n, _calls) in per_world.items()}
        assert len(set(counts.values())) == 1, (rank, per_world)  # flat: no call per other rank
        assert counts[64] <= MAX_RESTART_CALLS, per_world
