"""Configuration from the environment: activation, defaults and clear errors."""

import pytest

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
