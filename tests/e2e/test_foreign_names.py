"""Names are parsed in their canonical ASCII form, in full; every other name is foreign.

``ckpt-e0\\n``, ``ckpt-e00``, ``ckpt-e\\u0660`` (an Arabic-Indic zero) were taken for the
checkpoint at epoch 0 (``\\d`` matches any Unicode digit, ``$`` matches before a trailing
newline, no leading-zero rule) and deleted by rank 0's retention; likewise ``rank-K``,
``bad-rank-K`` and ``gen-N``. The layout promises foreign names are never read or deleted.
"""
import os

from hypothesis import given, settings
from hypothesis import strategies as st
from support.e2e import JOB_ID
from test_multirank_e2e import start_job

from paddle_acp.format import layout
from paddle_acp.format.commit import fencing
from paddle_acp.storage import open_storage

FOREIGN = ["ckpt-e0\n", "ckpt-e00", "ckpt-e\u0660", "ckpt-e0-s00", "ckpt-e\uff10", "ckpt-00", "ckpt-0\n",
           "ckpt-\u0660"]


def test_rank_0_never_deletes_foreign_directories_that_look_like_checkpoints(tmp_path):
    """Two ranks train 2 epochs, foreign directories appear beside their checkpoints, the job goes on
    for 2 more epochs keeping 1 checkpoint: retention deletes the job's old checkpoints, never them."""
    ckpt = tmp_path / "ckpt"
    env = {"PADDLE_ACP_MAX_TO_KEEP": 1}
    res = start_job(tmp_path, 2, "--kind", "tp", "--epochs", 2, ckpt=ckpt, env=env)
    assert all(rc == 0 for rc, _ in res), res
    rdir = ckpt / JOB_ID / "range" / "_range_0"
    assert sorted(os.listdir(rdir)) == ["ckpt-e1", "plan.json"], os.listdir(rdir)  # plan.json: rank 0's save plan
    for name in FOREIGN:
        (rdir / name).mkdir()
        (rdir / name / "data.txt").write_text("not paddle-acp's: " + repr(name))
    # a copy of the committed checkpoint under a foreign name: never taken for it either
    (rdir / "ckpt-e1\n").mkdir()
    for f in ("global.json",):
        (rdir / "ckpt-e1\n" / f).write_bytes((rdir / "ckpt-e1" / f).read_bytes())
    res = start_job(tmp_path, 2, "--kind", "tp", "--epochs", 4, ckpt=ckpt, env=env, gen="g1")
    assert all(rc == 0 for rc, _ in res), [out[-3000:] for _, out in res]
    names = sorted(os.listdir(rdir))
    assert names == sorted(FOREIGN + ["ckpt-e1\n", "ckpt-e3", "plan.json"]), names
    for name in FOREIGN:
        assert (rdir / name / "data.txt").read_text() == "not paddle-acp's: " + repr(name)
    assert (rdir / "ckpt-e1\n" / "global.json").exists()


def test_a_foreign_generation_name_fences_no_writer(tmp_path):
    st_ = open_storage(str(tmp_path))
    fence = fencing.Fence.take(st_, "j")
    assert fence.generation == 0
    for name in ("gen-9\n", "gen-09", "gen-\u0669", "gen-9 ", "gen-+9"):
        (tmp_path / "j" / "writers" / name).write_text("{}")
    assert fencing.newest_generation(st_, "j") == 0
    fence.check("commit")  # still the newest: nothing foreign counts
    assert fencing.Fence.take(st_, "j").generation == 1


# -- every parser: what parses re-renders to itself --------------------------------------------
NAMES = st.one_of(
    st.text(max_size=24),
    st.builds(lambda p, d, t: p + d + t,
              st.sampled_from(["ckpt-", "ckpt-e", "rank-", "bad-rank-", "absent-rank-", "gen-", "ckpt-e1-s"]),
              st.text(st.characters(whitelist_categories=("Nd",)), min_size=1, max_size=16),
              st.sampled_from(["", "\n", " ", "-s0", "-s00", ".tmp-ab12", "\x00"])),
    st.builds(lambda p, n, t: p + n + t,
              st.sampled_from(["ckpt-", "ckpt-e", "rank-", "bad-rank-", "absent-rank-", "gen-", "ckpt-e3-s"]),
              st.integers(0, 10**16).map(str), st.sampled_from(["", "\n", "-s7", ".tmp-0f"])),
)


@settings(max_examples=1500, deadline=None)
@given(NAMES)
def test_any_name_that_parses_re_renders_to_itself(name):
    n = layout.parse_final(name)
    if n is not None:
        assert layout.final_name(n) == name
    m = layout.TMP_RE.fullmatch(name)  # (commit/atomic.py lists leftovers with it)
    if m is not None:
        assert name.startswith(layout.final_name(int(m.group(1))) + ".tmp-") and name.isascii() and "\n" not in name
    pos = layout.parse_name(name)
    if pos is not None:
        assert layout.position_name(*pos) == name
    r = layout.parse_part(name)
    if r is not None:
        assert layout.rank_part(r) == name
    bad = layout.parse_bad_mark(name)
    if bad is not None:
        assert layout.bad_mark(*bad) == name
    absent = layout.parse_absent_mark(name)
    if absent is not None:
        assert layout.absent_mark(absent) == name
    for regex, render in ((layout.PART_RE, layout.rank_part), (fencing._GEN_RE, lambda k: f"gen-{k}")):
        for m in (regex.match(name), regex.fullmatch(name)):
            if m is not None:
                assert render(int(m.group(1))) == name
    m = layout.PART_TMP_RE.match(name)
    if m is not None:
        assert name.startswith(layout.rank_part(int(m.group(1))) + ".tmp-") and "\n" not in name


def test_canonical_names_parse():
    assert layout.parse_name("ckpt-e0") == (0, None) and layout.parse_name("ckpt-e10-s0") == (10, 0)
    assert layout.parse_final("ckpt-0") == 0 and layout.parse_part("rank-12") == 12
    for name in FOREIGN + ["ckpt-e1\n"]:
        assert layout.parse_name(name) is None and layout.parse_final(name) is None
