"""Which storage options are credentials, and how they are redacted or refused."""

from __future__ import annotations

import pytest

from dyngen.config.secrets import (
    REDACTED,
    config_secret_paths,
    redact_config,
    redact_overrides,
    refuse_redacted,
    refuse_secrets,
    secret_paths,
)
from dyngen.errors import ConfigError

OPTIONS = {
    "endpoint_url": "http://minio:9000", "anon": False, "use_ssl": True, "key": "AKIA1",
    "secret": "s3cr3t", "token": "sess", "password": "pw", "requester_pays": True,
    "client_kwargs": {"region_name": "eu-west-1", "aws_secret_access_key": "s2",
                      "aws_session_token": "t2"},
    "config_kwargs": {"retries": {"max_attempts": 3}},
    "account_key": "az", "sas_token": "sas", "connection_string": "cs",
    "credentials": {"type": "service_account", "private_key": "pk"},
}


def test_credentials_are_found_at_any_depth_and_nothing_else() -> None:
    assert secret_paths(OPTIONS) == [f"store.storage_options.{p}" for p in (
        "key", "secret", "token", "password", "client_kwargs.aws_secret_access_key",
        "client_kwargs.aws_session_token", "account_key", "sas_token", "connection_string",
        "credentials")]


@pytest.mark.parametrize("token", ["anon", "google_default", "cloud", "/etc/gcs/key.json",
                                   "~/key.json", "", None, False])
def test_a_gcsfs_token_that_names_how_to_find_credentials_is_no_credential(token) -> None:
    assert secret_paths({"token": token, "project": "p"}) == []


def test_redaction_keeps_everything_but_the_credentials() -> None:
    config = {"store": {"root": "s3://b/x", "storage_options": OPTIONS}, "data": {"a": 1}}
    shown = redact_config(config)
    options = shown["store"]["storage_options"]
    assert options["endpoint_url"] == "http://minio:9000" and options["anon"] is False
    assert options["client_kwargs"] == {"region_name": "eu-west-1",
                                        "aws_secret_access_key": REDACTED,
                                        "aws_session_token": REDACTED}
    assert options["credentials"] == REDACTED and shown["data"] == {"a": 1}
    assert config["store"]["storage_options"]["secret"] == "s3cr3t"  # the original is kept
    plain = {"store": {"root": "x", "storage_options": {"endpoint_url": "u"}}}
    assert redact_config(plain) is plain


def test_overrides_that_set_a_credential_are_redacted() -> None:
    given = ["store.storage_options.secret=abc", "+store.storage_options.client_kwargs."
             "aws_secret_access_key=def", "store.storage_options={key: k, secret: s}",
             "store.storage_options.endpoint_url=http://h:1", "store.root=s3://b/x",
             "data.max_prompt_length=64", "store.storage_options.secret=[unclosed"]
    assert redact_overrides(given) == [
        f"store.storage_options.secret={REDACTED}",
        f"+store.storage_options.client_kwargs.aws_secret_access_key={REDACTED}",
        f"store.storage_options={REDACTED}", "store.storage_options.endpoint_url=http://h:1",
        "store.root=s3://b/x", "data.max_prompt_length=64",
        f"store.storage_options.secret={REDACTED}"]


@pytest.mark.parametrize(("root", "option", "variable"), [
    ("s3://b/x", {"client_kwargs": {"aws_secret_access_key": "v"}},
     "AWS_SECRET_ACCESS_KEY for aws_secret_access_key"),
    ("gs://b/x", {"token": {"type": "service_account"}}, "GOOGLE_APPLICATION_CREDENTIALS"),
    ("az://c/x", {"account_key": "v"}, "AZURE_STORAGE_KEY for account_key"),
    ("sftp://h/x", {"password": "v"}, "the filesystem's own environment variable"),
])
def test_refusal_names_the_option_and_where_it_belongs(root, option, variable) -> None:
    with pytest.raises(ConfigError) as refused:
        refuse_secrets({"store": {"root": root, "storage_options": option}}, "a deployment")
    assert variable in str(refused.value) and "'v'" not in str(refused.value)
    assert "expected no credentials in store.storage_options" in str(refused.value)


def test_the_mirrors_options_are_kept_out_of_the_records_too() -> None:
    """The mirror's fsspec and delta-rs options reach a filesystem as the store's do: a
    credential there is redacted, refused and named the same way."""
    config = {"store": {"root": "/data/store", "storage_options": {}},
              "mirror": {"dest": "s3://lake/dyngen",
                         "storage_options": {"secret": "s3cr3t", "anon": False},
                         "delta_options": {"AWS_SECRET_ACCESS_KEY": "s3cr3t",
                                           "AWS_S3_LOCKING_PROVIDER": "dynamodb"}}}
    assert config_secret_paths(config) == ["mirror.storage_options.secret",
                                           "mirror.delta_options.AWS_SECRET_ACCESS_KEY"]
    redacted = redact_config(config)
    assert "s3cr3t" not in repr(redacted)
    assert redacted["mirror"]["delta_options"]["AWS_S3_LOCKING_PROVIDER"] == "dynamodb"
    assert redact_overrides(["mirror.delta_options.AWS_SECRET_ACCESS_KEY=s3cr3t"]) == [
        f"mirror.delta_options.AWS_SECRET_ACCESS_KEY={REDACTED}"]
    with pytest.raises(ConfigError, match="AWS_SECRET_ACCESS_KEY") as exc:
        refuse_secrets(config, "a deployment")
    assert "s3cr3t" not in str(exc.value)
    with pytest.raises(ConfigError, match=r"mirror\.storage_options\.secret"):
        refuse_redacted(redacted)
