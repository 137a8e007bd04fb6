"""Credentials kept out of messages (``paddle_acp.secrets``): user info holding "/", "?", "#", "@" or a quote, user
info without a scheme (``user:pass@host:port``), query secrets after ";" or written with "+", malformed URIs (a
ConfigError naming the URI redacted, never Python's ValueError), and JSON scrubbed value by value."""
from __future__ import annotations

import json
import logging
from urllib.parse import unquote, unquote_plus

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from paddle_acp import cli, secrets
from paddle_acp.errors import ConfigError
from paddle_acp.format.checkpoints.metrics_log import scrubbed_line
from paddle_acp.format.metrics_record import MetricsRecord, SaveBegun
from paddle_acp.secrets import redact, register_secret, register_uri, scrub, uri_secrets
from paddle_acp.storage import open_storage
from paddle_acp.storage.etcd import parse_endpoint
from paddle_acp.storage.schemes import parse_uri
from paddle_acp.tools.render import emit_json

# a password's characters: URL-safe ones and those a parser splits on ("/", "?", "#", "@", ":"), a quote, "+", "%"
_ANY = st.text(st.sampled_from("aZ09-_.~/?#@:'+% ;&=!$*()"), min_size=4, max_size=24)
_QUERY = st.text(st.sampled_from("aZ09-_.~/?@:'+% !$*()"), min_size=4, max_size=24)  # no "&", ";", "#", "="
_SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
def own_secrets():
    """The registry as it was after the test: a secret such as "true" must not mask other tests' messages."""
    before = set(secrets._SECRETS)
    yield
    secrets._SECRETS.clear()
    secrets._SECRETS.update(before)


def forms(secret):
    return {f for f in (secret, unquote(secret), unquote_plus(secret)) if len(f) >= 3}


# -- item 1: a password holding "/" (an AWS secret key), "?", "#", "@" or a quote -------------------------------
@_SETTINGS
@given(tail=_ANY, scheme=st.sampled_from(["s3", "hdfs", "viewfs"]))
def test_no_form_of_a_user_info_password_is_ever_shown(tail, scheme):
    secret = "Qz9" + tail
    uri = f"{scheme}://AKIDX:{secret}@bucket/prefix"
    assert redact(uri) == f"{scheme}://bucket/prefix"
    register_uri(uri)
    shown = scrub(f"cannot reach storage root {uri!r}: {uri} failed")
    assert not any(f in shown for f in forms(secret)), shown
    try:
        parse_uri(uri)
    except ConfigError as exc:  # a "/" before the "@": the URI's port is no number
        assert not any(f in str(exc) for f in forms(secret)) and "s3://bucket" in str(exc) or scheme != "s3", exc


def test_an_aws_secret_with_a_slash_is_neither_shown_nor_a_raw_value_error(capsys):
    uri = "s3://AKIAEXAMPLE:wJalrXUtnFEMI/K7MDENG/bPxRfiSLASHLEAK@bucket/prefix"
    assert "SLASHLEAK" not in redact(uri) and "K7MDENG" in "".join(uri_secrets(uri))
    assert cli.main(["ls", uri]) == 2
    err = capsys.readouterr().err
    assert "SLASHLEAK" not in err and "K7MDENG" not in err and "'s3://bucket/prefix' is malformed" in err, err
    with pytest.raises(ConfigError, match="must be percent-encoded") as exc:
        open_storage("hdfs://someone:Hd/fsLeak@nn:9000/ck")
    assert "Hd" not in str(exc.value) and "fsLeak" not in str(exc.value)


# -- item 3 / 4: user info without a scheme (host:port endpoints, a forgotten scheme) -----------------------------
@_SETTINGS
@given(tail=_ANY)
def test_user_info_without_a_scheme_is_masked(tail):
    secret = "Qz9" + tail
    shown = redact(f"root:{secret}@etcd.example:2379")
    assert shown == "***@etcd.example:2379", shown
    assert secret in uri_secrets(f"root:{secret}@etcd.example:2379")


def test_an_etcd_endpoint_with_credentials_is_not_echoed():
    for text in ("root:EtcdPw42@127.0.0.1:2379", "etcd://root:EtcdPw42@127.0.0.1:2379", "ro:Etcd/Pw42@h:1"):
        with pytest.raises(ValueError, match="no user info") as exc:
            parse_endpoint(text)
        assert "EtcdPw42" not in str(exc.value) and "Pw42" not in str(exc.value), exc.value


@_SETTINGS
@given(tail=_ANY, master=st.booleans())
def test_a_store_endpoint_with_credentials_is_refused_and_never_shown(tail, master, own_secrets, tmp_path, caplog):
    """PADDLE_MASTER or MASTER_ADDR with user info: a ConfigError naming the variable, the value redacted (as
    parse_endpoint does for etcd), and the password registered by from_env before anything logs it."""
    from paddle_acp.config import CheckpointConfig, from_env
    from paddle_acp.runtime.coord import open_coordinator

    secret = "Qz9" + tail
    caplog.clear()
    env = ({"PADDLE_MASTER": f"alice:{secret}@127.0.0.1:2379"} if master else
           {"MASTER_ADDR": f"alice:{secret}@127.0.0.1", "MASTER_PORT": "2379"})
    env.update(PADDLE_TRAINERS_NUM="2", PADDLE_TRAINER_ID="1", PADDLE_ACP_COORDINATION="store")
    from_env(env)
    logging.getLogger("paddle_acp").warning("the job's store: %s", env.get("PADDLE_MASTER", env.get("MASTER_ADDR")))
    with pytest.raises(ConfigError, match="only HOST:PORT") as exc:
        open_coordinator(CheckpointConfig(uri=str(tmp_path), trainer_id=1, world_size=2), open_storage(str(tmp_path)),
                         "j/range/r", "r", env=env)
    shown = f"{exc.value}\n{caplog.text}"
    assert f"{'PADDLE_MASTER' if master else 'MASTER_ADDR'}: '***@127.0.0.1:2379'" in shown, shown
    assert not any(f in shown for f in forms(secret)), shown


# -- item 5: query secrets after ";", with "+" or percent escapes --------------------------------------------------
@_SETTINGS
@given(tail=_QUERY, sep=st.sampled_from(["&", ";"]), name=st.sampled_from(
    ["secret_key", "access_key", "session_token", "password", "token", "SECRET_KEY"]))
def test_every_form_of_a_query_secret_is_registered(tail, sep, name, own_secrets):
    secret = "Qz9" + tail
    uri = f"s3://bucket/p x?endpoint_override=127.0.0.1:9000&scheme=http{sep}{name}={secret}"
    register_uri(uri)
    for form in forms(secret):  # pyarrow echoes the query as written, or decoded
        shown = scrub(f"Invalid S3 connection scheme 'http{sep}{name}={form}'; Cannot parse URI: '{uri}'")
        assert not any(f in shown for f in forms(secret)), shown
    assert redact(uri) == "s3://bucket/p x"
    shown = redact(f"host:1?a=1;{name}={secret}")  # no scheme: the query kept, its secrets masked
    assert not any(f in shown for f in forms(secret)) and shown.endswith(("=***", "***@")), shown
    assert redact(f"host:1?a=1;{name}=Qz9+x%2F") == f"host:1?a=1;{name}=***"


def test_a_nested_uri_in_a_query_has_its_user_info_registered(own_secrets):
    uri = "s3://bucket/p?endpoint_override=AKx:Nest7Leak@127.0.0.1:9000&scheme=http"
    assert redact(uri) == "s3://bucket/p" and "Nest7Leak" in uri_secrets(uri)


# -- item 13: malformed URIs ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("uri, why", [("hdfs://nn:99999/p", "the port is not in 0-65535"),
                                      ("hdfs://u:Pw13Leak@[::1/p", "IPv6 host"),
                                      ("s3://bucket:x9/p", "not a port number")])
def test_a_malformed_uri_is_a_config_error_never_a_value_error(uri, why, capsys):
    with pytest.raises(ConfigError, match=why) as exc:
        open_storage(uri)
    assert redact(uri) in str(exc.value) and "Pw13Leak" not in str(exc.value)
    for command in (["ls", uri], ["verify", uri], ["inspect", uri + "/j/range/r/ckpt-1"]):
        assert cli.main(command) == 2, command
        err = capsys.readouterr().err
        assert why in err and "Pw13Leak" not in err and "Traceback" not in err, err


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_the_redactor_never_raises(text):
    uri_secrets(text), redact(text), uri_secrets("hdfs://" + text), redact("s3://" + text)


# -- item 8: a secret that is a common word leaves records and JSON valid ------------------------------------------
@pytest.mark.parametrize("secret", ["saved", "true", "auto", "null", "start"])
def test_a_common_word_secret_never_corrupts_a_metrics_record(secret, own_secrets):
    register_secret(secret)
    begun = SaveBegun(range="_range_0", epoch=1, step=None, stall_s=0.1, waited_s=0.0, policy="auto")
    for rec in (begun.saved(number=1, nbytes=10, persist_s=0.5),
                begun.part(name="ckpt-e1", nbytes=10, persist_s=0.5, rank=0, committed=True, parts_wait_s=0.0),
                MetricsRecord.start(range="_range_0", restored=None, policy="auto", restore_source=None)):
        back = MetricsRecord.from_line(scrubbed_line(rec))
        assert back.to_dict() == rec.to_dict(), (secret, scrubbed_line(rec))
    failed = begun.failed(error=OSError(f"denied for user,{secret}: x"), persist_s=0.1)
    back = MetricsRecord.from_line(scrubbed_line(failed))
    assert back.event == "failed" and back.error == "denied for user,***: x", back


def test_json_output_is_scrubbed_value_by_value(own_secrets, capsys):
    register_secret("true")
    register_secret('pw"q\u00e9')
    emit_json({"ok": True, "error": 'failed: true pw"q\u00e9', "n": None})
    doc = json.loads(capsys.readouterr().out)
    assert doc == {"ok": True, "error": "failed: *** ***", "n": None}
