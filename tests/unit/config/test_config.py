"""Configuration from the environment: activation, defaults and clear errors."""

import pathlib
import re
import signal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from paddle_acp import config
from paddle_acp.config import CheckpointConfig, from_env
from paddle_acp.errors import ConfigError

CLOUD = {
    "PADDLE_RUNNING_ENV": "PADDLE_EDL_AUTO_CHECKPOINT",
    "PADDLE_RUNNING_PLATFORM": "PADDLE_CLOUD",
    "PADDLE_JOB_ID": "job-1",
    "PADDLE_EDL_HDFS_HOME": "/opt/hadoop",
    "PADDLE_EDL_HDFS_NAME": "hdfs://nn:9000",
    "PADDLE_EDL_HDFS_UGI": "alice,secret",
    "PADDLE_EDL_HDFS_CHECKPOINT_PATH": "/user/alice/ckpt",
    "PADDLE_TRAINER_ID": "0",
}


def test_inactive_by_default():
    cfg = from_env({})
    assert not cfg.active
    assert "PADDLE_ACP_CHECKPOINT_URI" in cfg.inactive_reason


@given(st.text(" \t\n\r\x0b\x0c", max_size=3), st.text(" \t\n\r\x0b\x0c", max_size=3))
def test_running_env_is_stripped_like_every_variable(before, after):
    """Before: 'PADDLE_EDL_AUTO_CHECKPOINT ' switched checkpointing off, with a line saying it "is not set"."""
    env = dict(CLOUD, PADDLE_RUNNING_ENV=before + "PADDLE_EDL_AUTO_CHECKPOINT" + after)
    cfg = from_env(env)
    assert cfg.active and cfg.source == "PaddleCloud" and cfg.uri == "hdfs://nn:9000/user/alice/ckpt"
    run_env, cfg = config.paddlecloud_view_from_env(dict(env, PADDLE_ACP_CHECKPOINT_URI="/elsewhere"))
    assert run_env == "PADDLE_EDL_AUTO_CHECKPOINT" and cfg.source == "PaddleCloud"


def test_another_running_env_says_what_it_is():
    cfg = from_env(dict(CLOUD, PADDLE_RUNNING_ENV="PADDLE_EDL_AUTO_CHECKPOINTS"))
    assert not cfg.active
    assert "PADDLE_RUNNING_ENV='PADDLE_EDL_AUTO_CHECKPOINTS' is not PADDLE_EDL_AUTO_CHECKPOINT" in cfg.inactive_reason
    assert "is not set" not in cfg.inactive_reason.replace("PADDLE_ACP_CHECKPOINT_URI is not set", "")
    assert "neither" in from_env(dict(CLOUD, PADDLE_RUNNING_ENV=" ")).inactive_reason


def test_plain_uri_defaults():
    cfg = from_env({"PADDLE_ACP_CHECKPOINT_URI": "/tmp/x"})
    assert cfg.active and cfg.uri == "/tmp/x"
    assert (cfg.job_id, cfg.trainer_id, cfg.save_interval, cfg.max_to_keep, cfg.async_save) == ("default", 0, 900.0, 3, True)


def test_plain_uri_overrides():
    cfg = from_env(
        {
            "PADDLE_ACP_CHECKPOINT_URI": "file:///tmp/x",
            "PADDLE_JOB_ID": "j.2",
            "PADDLE_TRAINER_ID": "3",
            "PADDLE_ACP_SAVE_INTERVAL": "1.5",
            "PADDLE_EDL_SAVE_CHECKPOINT_INTER": "99",
            "PADDLE_ACP_MAX_TO_KEEP": "0",
            "PADDLE_ACP_ASYNC": "0",
        }
    )
    assert (cfg.job_id, cfg.trainer_id, cfg.save_interval, cfg.max_to_keep, cfg.async_save) == ("j.2", 3, 1.5, 0, False)


def test_edl_interval_used_when_acp_one_missing():
    assert from_env({"PADDLE_ACP_CHECKPOINT_URI": "x", "PADDLE_EDL_SAVE_CHECKPOINT_INTER": "7"}).save_interval == 7.0


def test_paddlecloud_hdfs():
    cfg = from_env(CLOUD)
    assert cfg.uri == "hdfs://nn:9000/user/alice/ckpt"
    assert cfg.source == "PaddleCloud" and cfg.hdfs_ugi == "alice,secret" and cfg.job_id == "job-1"


def test_paddlecloud_ce_test_is_local_and_needs_no_hadoop():
    env = dict(CLOUD, PADDLE_EDL_ONLY_FOR_CE_TEST="1", PADDLE_EDL_HDFS_NAME="", PADDLE_EDL_HDFS_CHECKPOINT_PATH="rel/ck")
    del env["PADDLE_EDL_HDFS_HOME"]
    cfg = from_env(env)
    assert cfg.uri == "rel/ck" and cfg.ce_test


@pytest.mark.parametrize(
    "env, needle",
    [
        ({"PADDLE_ACP_CHECKPOINT_URI": "x", "PADDLE_JOB_ID": "a/b"}, "PADDLE_JOB_ID='a/b'"),
        ({"PADDLE_ACP_CHECKPOINT_URI": "x", "PADDLE_JOB_ID": ".."}, "PADDLE_JOB_ID='..'"),
        ({"PADDLE_ACP_CHECKPOINT_URI": "x", "PADDLE_JOB_ID": "a..b"}, "PADDLE_JOB_ID"),
        ({"PADDLE_ACP_CHECKPOINT_URI": "x", "PADDLE_TRAINER_ID": "one"}, "PADDLE_TRAINER_ID='one'"),
        ({"PADDLE_ACP_CHECKPOINT_URI": "x", "PADDLE_TRAINER_ID": "-1"}, "PADDLE_TRAINER_ID"),
        ({"PADDLE_ACP_CHECKPOINT_URI": "x", "PADDLE_ACP_SAVE_INTERVAL": "-5"}, "PADDLE_ACP_SAVE_INTERVAL='-5'"),
        ({"PADDLE_ACP_CHECKPOINT_URI": "x", "PADDLE_ACP_SAVE_INTERVAL": "soon"}, "PADDLE_ACP_SAVE_INTERVAL='soon'"),
        ({"PADDLE_ACP_CHECKPOINT_URI": "x", "PADDLE_EDL_SAVE_CHECKPOINT_INTER": "nan"}, "PADDLE_EDL_SAVE_CHECKPOINT_INTER"),
        ({"PADDLE_ACP_CHECKPOINT_URI": "x", "PADDLE_ACP_MAX_TO_KEEP": "-1"}, "PADDLE_ACP_MAX_TO_KEEP"),
        ({"PADDLE_ACP_CHECKPOINT_URI": "x", "PADDLE_ACP_ASYNC": "maybe"}, "PADDLE_ACP_ASYNC='maybe'"),
        (dict(CLOUD, PADDLE_JOB_ID=""), "PADDLE_JOB_ID is not set"),
        ({k: v for k, v in CLOUD.items() if k != "PADDLE_JOB_ID"}, "PADDLE_JOB_ID is not set"),
        ({k: v for k, v in CLOUD.items() if k != "PADDLE_TRAINER_ID"}, "PADDLE_TRAINER_ID is not set"),
        ({k: v for k, v in CLOUD.items() if k != "PADDLE_EDL_HDFS_CHECKPOINT_PATH"}, "PADDLE_EDL_HDFS_CHECKPOINT_PATH"),
        (dict(CLOUD, PADDLE_EDL_HDFS_NAME=""), "PADDLE_EDL_HDFS_NAME is empty"),
        (dict(CLOUD, PADDLE_EDL_HDFS_NAME="nn:9000"), "PADDLE_EDL_HDFS_NAME='nn:9000'"),
        (dict(CLOUD, PADDLE_EDL_HDFS_UGI="alice"), "PADDLE_EDL_HDFS_UGI"),
        (dict(CLOUD, PADDLE_EDL_HDFS_NAME="hdfs://nn:9000?token=x"), "no query or fragment"),
        ({"PADDLE_ACP_CHECKPOINT_URI": "x", "PADDLE_EDL_SAVE_CHECKPOINT_INTER": "1_000"}, "'1_000'"),
        ({"PADDLE_ACP_CHECKPOINT_URI": "x", "PADDLE_ACP_MAX_TO_KEEP": "1_0"}, "PADDLE_ACP_MAX_TO_KEEP='1_0'"),
        # read only where used (several ranks, an HDFS location), refused when the configuration is read
        ({"PADDLE_ACP_CHECKPOINT_URI": "x", "PADDLE_ACP_COORDINATION": "foo"}, "PADDLE_ACP_COORDINATION='foo'"),
        ({"PADDLE_ACP_CHECKPOINT_URI": "x", "PADDLE_ACP_CONNECT_EARLY": "foo"}, "PADDLE_ACP_CONNECT_EARLY='foo'"),
        # numbers in ASCII only: Python's int() and float() take "１" (full width) and "٣" (Arabic-Indic)
        ({"PADDLE_ACP_CHECKPOINT_URI": "x", "PADDLE_ACP_MAX_TO_KEEP": "１"}, "PADDLE_ACP_MAX_TO_KEEP='１'"),
        ({"PADDLE_ACP_CHECKPOINT_URI": "x", "PADDLE_ACP_SAVE_INTERVAL": "１"}, "PADDLE_ACP_SAVE_INTERVAL='１'"),
        ({"PADDLE_ACP_CHECKPOINT_URI": "x", "PADDLE_EDL_SAVE_CHECKPOINT_INTER": "٣0"}, "PADDLE_EDL_SAVE_CHECKPOINT_INTER"),
        ({"PADDLE_ACP_CHECKPOINT_URI": "x", "PADDLE_TRAINER_ID": "１"}, "PADDLE_TRAINER_ID='１'"),
        ({"PADDLE_ACP_CHECKPOINT_URI": "x", "PADDLE_TRAINERS_NUM": "٣"}, "PADDLE_TRAINERS_NUM='٣'"),
        ({"PADDLE_ACP_CHECKPOINT_URI": "x", "PADDLE_ACP_PART_TIMEOUT": "1.５"}, "PADDLE_ACP_PART_TIMEOUT='1.５'"),
        ({"PADDLE_ACP_CHECKPOINT_URI": "x", "PADDLE_ACP_CONNECT_TIMEOUT": "１0"}, "PADDLE_ACP_CONNECT_TIMEOUT='１0'"),
    ],
)
def test_bad_config_names_variable_and_value(env, needle):
    with pytest.raises(ConfigError) as exc:
        from_env(env)
    assert needle in str(exc.value)


def test_dataclass_validates():
    with pytest.raises(ConfigError, match="job"):
        CheckpointConfig(uri="x", job_id="../etc")
    with pytest.raises(ConfigError, match="save_interval"):
        CheckpointConfig(uri="x", save_interval=-1)


def test_launcher_without_job_id_warns(caplog):
    env = {"PADDLE_ACP_CHECKPOINT_URI": "x", "PADDLE_LOG_DIR": "log", "POD_NAME": "pod0"}
    assert from_env(env).job_id == "default"
    assert "PADDLE_JOB_ID is not set" in caplog.text
    caplog.clear()
    from_env(dict(env, PADDLE_JOB_ID="j1"))
    assert "PADDLE_JOB_ID is not set" not in caplog.text


# -- every variable in one place --------------------------------------------------------------
PKG = pathlib.Path(config.__file__).resolve().parent.parent  # paddle_acp/ (config is a package)
README = PKG.parent / "README.md"


def _package_sources():
    return sorted(p for p in PKG.rglob("*.py"))


def test_every_paddle_acp_variable_is_listed_and_documented():
    """A PADDLE_ACP_* name anywhere in the package is in config.ENV_VARS and in README.md's table."""
    readme_rows = {m.group(1) for m in re.finditer(r"^\| `([A-Z0-9_]+)` \|", README.read_text(), re.M)}
    seen = {}
    for path in _package_sources():
        for name in re.findall(r"\bPADDLE_ACP_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()):
            seen.setdefault(name, path.relative_to(PKG.parent))
    assert len(seen) >= 10, seen  # the grep found the package's variables
    # config.names.TOOLING_VARS: the names the tests and CI read (known, so never warned about; not the library's)
    from paddle_acp.config.names import TOOLING_VARS

    unlisted = {n: str(p) for n, p in seen.items() if n not in config.ENV_VARS and n not in TOOLING_VARS}
    assert not unlisted, f"read but not in config.ENV_VARS: {unlisted}"
    assert not set(TOOLING_VARS) & set(config.ENV_VARS)
    undocumented = sorted(n for n in config.ENV_VARS if n.startswith("PADDLE_") and n not in readme_rows)
    assert not undocumented, f"in config.ENV_VARS but no row in README.md's table: {undocumented}"
    assert len(set(config.ENV_VARS)) == len(config.ENV_VARS)


def test_environment_is_read_in_config_only():
    """No module outside paddle_acp.config reads os.environ / getenv (handing a copy of the environment to a
    subprocess, and setting a variable, are not reads)."""
    read = re.compile(r"os\.environ\.get\(|os\.getenv\(|os\.environ\[[^\]]+\](?!\s*=[^=])|environ\.get\(|"
                      r"os\.environ if env is None")
    offenders = []
    for path in _package_sources():
        if PKG / "config" in path.parents:
            continue
        for no, line in enumerate(path.read_text().splitlines(), 1):
            if read.search(line):
                offenders.append(f"{path.relative_to(PKG.parent)}:{no}: {line.strip()}")
    assert not offenders, "environment read outside paddle_acp/config/:\n" + "\n".join(offenders)


@pytest.mark.parametrize("raw,value", [("1", True), ("true", True), (" Yes ", True), ("ON", True),
                                       ("0", False), ("false", False), ("no", False), ("Off", False)])
def test_parse_bool_words(raw, value):
    assert config.parse_bool(raw, "X", not value) is value


@given(st.one_of(st.none(), st.text(alphabet=" \t", max_size=3)), st.booleans())
def test_parse_bool_unset_or_blank_is_the_default(raw, default):
    assert config.parse_bool(raw, "X", default) is default


@given(st.text(max_size=12).filter(lambda s: s.strip().lower() not in config.TRUE_WORDS + config.FALSE_WORDS
                                   and s.strip() != ""))
def test_parse_bool_anything_else_names_the_variable(raw):
    with pytest.raises(ConfigError, match="PADDLE_ACP_SOMETHING"):
        config.parse_bool(raw, "PADDLE_ACP_SOMETHING", True)


def test_booleans_of_every_reader_share_the_parser():
    for name, read in [("PADDLE_ACP_ASYNC", lambda e: config.from_env(e).async_save),
                       ("PADDLE_ACP_EXIT_ON_PREEMPT", config.exit_on_preempt_from_env)]:
        assert read({name: "off"}) is False and read({name: " YES "}) is True
        with pytest.raises(ConfigError, match=name):
            read({name: "maybe"})
    assert config.exit_on_preempt_from_env({}) is True
    assert config.progress_from_env({}) is None and config.progress_from_env({"PADDLE_ACP_PROGRESS": "auto"}) is None
    assert config.progress_from_env({"PADDLE_ACP_PROGRESS": "always"}) is True
    assert config.progress_from_env({"PADDLE_ACP_PROGRESS": "0"}) is False
    with pytest.raises(ConfigError, match="PADDLE_ACP_PROGRESS"):
        config.progress_from_env({"PADDLE_ACP_PROGRESS": "loud"})


def test_preempt_signals():
    assert config.preempt_signals_from_env({}) == [signal.SIGTERM]
    assert config.preempt_signals_from_env({"PADDLE_ACP_PREEMPT_SIGNALS": "TERM, sigusr1"}) == [
        signal.SIGTERM, signal.SIGUSR1]
    assert config.preempt_signals_from_env({"PADDLE_ACP_PREEMPT_SIGNALS": ""}) == []
    for bad in ("SIGKILL", "SIGNOPE", "STOP"):
        with pytest.raises(ConfigError, match="PADDLE_ACP_PREEMPT_SIGNALS"):
            config.preempt_signals_from_env({"PADDLE_ACP_PREEMPT_SIGNALS": bad})
    assert config.preempt_signals_from_env({"PADDLE_ACP_PREEMPT_SIGNALS": " \t "}) == []  # blank: as empty
    assert config.preempt_signals_from_env({"PADDLE_ACP_PREEMPT_SIGNALS": "TERM,SIGTERM"}) == [signal.SIGTERM]


FAULTS = ["SIGSEGV", "SIGBUS", "SIGFPE", "SIGILL", "SIGABRT", "SIGTRAP", "SIGSYS", "SIGKILL", "SIGSTOP"]
GOOD = ["SIGTERM", "SIGINT", "SIGUSR1", "SIGUSR2", "SIGHUP", "SIGQUIT", "SIGXCPU"]


def _spell(name, short, lower):
    name = name[3:] if short else name
    return name.lower() if lower else name


@given(st.lists(st.tuples(st.sampled_from(GOOD), st.booleans(), st.booleans()), max_size=5),
       st.tuples(st.sampled_from(FAULTS), st.booleans(), st.booleans()), st.integers(0, 5), st.booleans())
def test_preempt_signals_refuse_fault_and_uncatchable_signals(good, fault, at, with_fault):
    """Before: SIGSEGV/SIGBUS/SIGFPE/SIGILL/SIGABRT were accepted (a real fault then spun forever)."""
    parts = [_spell(*g) for g in good]
    if not with_fault:
        want = list(dict.fromkeys(int(getattr(signal, g[0])) for g in good))
        assert config.preempt_signals_from_env({"PADDLE_ACP_PREEMPT_SIGNALS": " , ".join(parts)}) == want
        return
    parts.insert(min(at, len(parts)), _spell(*fault))
    raw = ",".join(parts)
    with pytest.raises(ConfigError) as e:
        config.preempt_signals_from_env({"PADDLE_ACP_PREEMPT_SIGNALS": raw})
    first_bad = next(p for p in parts if ("SIG" + p.upper()).replace("SIGSIG", "SIG") in FAULTS)
    assert f"PADDLE_ACP_PREEMPT_SIGNALS={raw!r}: {('SIG' + first_bad.upper()).replace('SIGSIG', 'SIG')}" in str(e.value)


def test_storage_client_variables():
    assert config.hdfs_client_from_env({}) is None
    assert config.hdfs_client_from_env({"PADDLE_ACP_HDFS_CLIENT": "cli"}) == "cli"
    with pytest.raises(ConfigError, match="PADDLE_ACP_HDFS_CLIENT"):
        config.hdfs_client_from_env({"PADDLE_ACP_HDFS_CLIENT": "webhdfs"})
    assert config.hadoop_home_from_env({"HADOOP_HOME": "/h"}) == "/h"
    assert config.hadoop_home_from_env({"HADOOP_HOME": "/h", "PADDLE_EDL_HDFS_HOME": "/p"}) == "/p"
    s3 = config.s3_from_env({"AWS_ENDPOINT_URL": "http://a", "AWS_ENDPOINT_URL_S3": "http://b",
                             "AWS_DEFAULT_REGION": "eu", "AWS_SECRET_ACCESS_KEY": "k"})
    assert (s3.endpoint, s3.region, s3.secrets) == ("http://b", "eu", ("k",))
    assert config.s3_from_env({}) == config.S3Env(endpoint=None, region="us-east-1", secrets=())


def test_storage_settings_reach_the_backends_through_one_options_object():
    """The storage and format layers never call config's ``*_from_env`` readers: every storage setting
    reaches a backend as the one StorageOptions object given to open_storage (storage/schemes.py alone builds it
    from the environment when a caller gave none)."""
    reader = re.compile(r"\b\w+_from_env\b")
    offenders = []
    for path in _package_sources():
        if not ({PKG / "storage", PKG / "format"} & set(path.parents)) or path == PKG / "storage" / "schemes.py":
            continue
        for no, line in enumerate(path.read_text().splitlines(), 1):
            if reader.search(line):
                offenders.append(f"{path.relative_to(PKG.parent)}:{no}: {line.strip()}")
    assert not offenders, "storage settings read outside config:\n" + "\n".join(offenders)
    opts = config.storage_options_from_env({"PADDLE_ACP_CONNECT_TIMEOUT": "7", "PADDLE_ACP_HDFS_CLIENT": "cli",
                                            "HADOOP_HOME": "/h", "PADDLE_EDL_HDFS_UGI": "u,pw-secret",
                                            "AWS_ENDPOINT_URL": "http://e:1", "PADDLE_EDL_FS_CACHE": "/c"})
    assert (opts.connect_timeout, opts.hdfs_client, opts.hadoop_home, opts.hdfs_ugi, opts.cache_dir, opts.s3.endpoint) \
        == (7.0, "cli", "/h", "u,pw-secret", "/c", "http://e:1")
    assert "pw-secret" not in repr(opts)  # the UGI is a secret
    cfg = config.from_env({"PADDLE_RUNNING_ENV": "PADDLE_EDL_AUTO_CHECKPOINT", "PADDLE_JOB_ID": "j",
                           "PADDLE_TRAINER_ID": "0", "PADDLE_EDL_HDFS_CHECKPOINT_PATH": "/ck",
                           "PADDLE_EDL_HDFS_NAME": "hdfs://nn:9000", "PADDLE_EDL_HDFS_UGI": "alice,pw-secret"})
    assert cfg.storage.hdfs_user == "alice" and cfg.storage.hdfs_ugi == "alice,pw-secret"


# -- the world size a checkpoint can record -----------------------------------------------------
def test_world_size_above_what_global_json_records_is_refused():
    """PADDLE_TRAINERS_NUM above 65536 was accepted: the job wrote checkpoints its global.json
    validation refuses on reading. One constant decides both."""
    from paddle_acp.format import global_manifest

    assert global_manifest.MAX_WORLD is config.MAX_WORLD == 65536
    ok = from_env({"PADDLE_ACP_CHECKPOINT_URI": "x", "PADDLE_TRAINER_ID": "0", "PADDLE_TRAINERS_NUM": "65536"})
    assert ok.world_size == 65536
    for raw in ("65537", "1000000"):
        with pytest.raises(ConfigError) as exc:
            from_env({"PADDLE_ACP_CHECKPOINT_URI": "x", "PADDLE_TRAINER_ID": "0", "PADDLE_TRAINERS_NUM": raw})
        assert f"PADDLE_TRAINERS_NUM={raw!r}" in str(exc.value) and "65536" in str(exc.value)
    with pytest.raises(ConfigError, match="65536"):
        CheckpointConfig(uri="x", world_size=65537)


# -- timeouts that become deadlines: an upper bound -------------------------------------------------
@given(st.floats(min_value=0, max_value=1e308, exclude_min=True), st.sampled_from(["", " ", "\t"]))
def test_connect_and_part_timeouts_are_bounded(seconds, pad):
    """Before: PADDLE_ACP_CONNECT_TIMEOUT=1e10 passed, then the clients failed ("timestamp out of range",
    "cannot convert float infinity", the hadoop CLI client: Fatal Python error, exit 134)."""
    raw = pad + repr(seconds) + pad
    for name, read, most in (("PADDLE_ACP_CONNECT_TIMEOUT", config.connect_timeout_from_env, 86400.0),
                             ("PADDLE_ACP_PART_TIMEOUT", lambda env: from_env(env).part_timeout, 7 * 86400.0)):
        env = {name: raw}
        if seconds <= most:
            assert read(env) == seconds
        else:
            with pytest.raises(ConfigError) as e:
                read(env)
            assert f"{name}={raw.strip()!r} is too large: at most {most:g} s" in str(e.value)


def test_save_intervals_that_mean_rarely_stay_unbounded():
    for name in ("PADDLE_ACP_SAVE_INTERVAL", "PADDLE_EDL_SAVE_CHECKPOINT_INTER"):
        assert from_env({name: "1e308"}).save_interval == 1e308
    with pytest.raises(ConfigError, match="PADDLE_ACP_PART_TIMEOUT"):
        CheckpointConfig(part_timeout=1e10)


@pytest.mark.parametrize("env, shown", [
    ({**CLOUD, "PADDLE_EDL_HDFS_NAME": "someone:NameLeak123@namenode:9000"}, "'***@namenode:9000'"),
    ({**CLOUD, "PADDLE_EDL_HDFS_NAME": "some:Name/Leak123@namenode:9000"}, "'***@namenode:9000'"),
    ({"PADDLE_ACP_CHECKPOINT_URI": "/tmp/x", "PADDLE_ACP_LOCAL_CACHE": "s3://AKID:CacheLeak789@bucket/cache"},
     "'s3://bucket/cache'"),
    ({"PADDLE_ACP_CHECKPOINT_URI": "/tmp/x", "PADDLE_ACP_LOCAL_CACHE": "s3://bucket/c?secret_key=CacheLeak789"},
     "'s3://bucket/c'"),
])
def test_config_errors_never_echo_credentials(env, shown):
    """A forgotten scheme (user:pass@host:port), a URI where a directory belongs: the value is shown redacted."""
    with pytest.raises(ConfigError) as exc:
        from_env(env)
    assert "Leak" not in str(exc.value) and shown in str(exc.value), exc.value
