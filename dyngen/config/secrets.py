"""Secrets in a config's option sections (`store.storage_options`, the mirror's
`storage_options` and `delta_options`), found by option name and kept out of Prefect's records.

A round's config is a flow run parameter, which Prefect stores and shows in plain text, and
a deployment stores its parameters the same way. A direct call of the round keeps working:
its parameters are recorded with each secret replaced by `REDACTED`, while the round itself
uses the values it was given. A config Prefect would keep (a deployment's parameters, or a
run of one) is refused with a ConfigError naming the option (never its value) and the
environment variable to use instead, where the filesystem finds credentials by itself.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from omegaconf import OmegaConf

from dyngen.config.reading import nest, parse_override
from dyngen.errors import ConfigError

REDACTED = "<redacted>"
OPTIONS = "store.storage_options"
# Every section of options handed to a filesystem or to delta-rs, where credentials could go.
SECTIONS = (("store", "storage_options"), ("mirror", "storage_options"),
            ("mirror", "delta_options"))
# Option names (any depth, any case) that hold a credential: exact names, and parts of names.
_SECRET_NAMES = frozenset({"key", "secret", "token", "password", "passwd", "pwd", "auth",
                           "credentials", "sas"})
_SECRET_PARTS = ("secret", "password", "passwd", "token", "credential", "private_key",
                 "access_key", "api_key", "account_key", "connection_string", "session_key")
# gcsfs's `token` may name how to find credentials instead of holding one.
_GCSFS_METHODS = frozenset({"anon", "google_default", "cache", "cloud", "browser"})
# Where a credential belongs instead, by option name: the variables the filesystems read.
_AWS = {"key": "AWS_ACCESS_KEY_ID", "aws_access_key_id": "AWS_ACCESS_KEY_ID",
        "secret": "AWS_SECRET_ACCESS_KEY", "aws_secret_access_key": "AWS_SECRET_ACCESS_KEY",
        "token": "AWS_SESSION_TOKEN", "aws_session_token": "AWS_SESSION_TOKEN"}
_AZURE = {"account_key": "AZURE_STORAGE_KEY", "sas_token": "AZURE_STORAGE_SAS_TOKEN",
          "connection_string": "AZURE_STORAGE_CONNECTION_STRING",
          "client_secret": "AZURE_CLIENT_SECRET"}


def is_secret(name: str, value: Any) -> bool:
    """Whether option `name` with `value` holds a credential (flags, numbers and gcsfs's
    named ways of finding credentials, or a path to a key file, do not)."""
    lowered = str(name).lower()
    if lowered not in _SECRET_NAMES and not any(part in lowered for part in _SECRET_PARTS):
        return False
    if value is None or isinstance(value, (bool, int, float)):
        return False
    if isinstance(value, str):
        if lowered == "token" and (value in _GCSFS_METHODS or value.startswith(("/", "~"))
                                   or value.endswith(".json")):
            return False
        return value != ""
    return True  # a mapping or a list under a credential's name (a service account's JSON)


def secret_paths(options: Any, prefix: str = OPTIONS) -> list[str]:
    """Dotted paths of the options under `options` that hold a credential."""
    found: list[str] = []
    if isinstance(options, Mapping):
        for name, value in options.items():
            path = f"{prefix}.{name}"
            if is_secret(str(name), value):
                found.append(path)
            else:
                found += secret_paths(value, path)
    return found


def redact_options(options: Any) -> Any:
    """A copy of `options` with every credential replaced by REDACTED."""
    if not isinstance(options, Mapping):
        return options
    return {name: REDACTED if is_secret(str(name), value) else redact_options(value)
            for name, value in options.items()}


def _plain(config: Any) -> Any:
    if OmegaConf.is_config(config):
        return OmegaConf.to_container(config, resolve=False)
    return config


def _sections_of(config: Any) -> list[tuple[str, str, Any]]:
    """(section, key, options) of each option section `config` has."""
    plain = _plain(config)
    found = []
    for section, key in SECTIONS:
        part = plain.get(section) if isinstance(plain, Mapping) else None
        if isinstance(part, Mapping) and isinstance(part.get(key), Mapping):
            found.append((section, key, part[key]))
    return found


def config_secret_paths(config: Any) -> list[str]:
    """Dotted paths of the credentials in every option section of `config`."""
    return [path for section, key, options in _sections_of(config)
            for path in secret_paths(options, f"{section}.{key}")]


def redact_config(config: Any) -> Any:
    """`config` with the credentials of its option sections redacted (itself if none)."""
    if not config_secret_paths(config):
        return config
    plain = dict(_plain(config))
    for section, key, options in _sections_of(config):
        plain[section] = {**plain[section], key: redact_options(options)}
    return plain


def redact_overrides(overrides: Any) -> Any:
    """`overrides` with the value of any that sets a credential in an option section
    replaced by REDACTED (one that does not parse, under `store` or `mirror`, is redacted
    whole)."""
    if not isinstance(overrides, Sequence) or isinstance(overrides, str):
        return overrides
    out = []
    for text in overrides:
        if not isinstance(text, str) or "=" not in text:
            out.append(text)
            continue
        head = text.split("=", 1)[0]
        if not head.strip().lstrip("+").startswith(tuple(s for s, _ in SECTIONS)):
            out.append(text)
            continue
        try:
            key, value = parse_override(text)
            secret = bool(config_secret_paths(nest(key, value)))
        except ConfigError:
            secret = True
        out.append(f"{head}={REDACTED}" if secret else text)
    return out


def refuse_secrets(config: Any, where: str) -> None:
    """ConfigError if `config` has a credential in an option section, since `where` would
    record it; the message names each option and its environment variable."""
    paths = config_secret_paths(config)
    if not paths:
        return
    plain = _plain(config)
    # Where each section's credentials are used: the store's root, the mirror's dest.
    where_to = {"store": str((plain.get("store") or {}).get("root") or ""),
                "mirror": str((plain.get("mirror") or {}).get("dest") or "")}
    hints = sorted({_env_hint(path.rsplit(".", 1)[-1], where_to[path.split(".", 1)[0]])
                    for path in paths})
    raise ConfigError(
        f"{', '.join(paths)}: expected no credentials in "
        f"{' or '.join(sorted({'.'.join(p.split('.')[:2]) for p in paths}))}, found "
        f"{'one' if len(paths) == 1 else len(paths)} ({where} would keep it in Prefect's "
        f"records, in plain text). Remove it and set {'; '.join(hints)} in the environment "
        "of every process that runs rounds (README: Storage backends).")


def refuse_redacted(config: Any) -> None:
    """ConfigError if an option holds REDACTED: a config copied from a recorded run."""
    redacted = [path for section, key, options in _sections_of(config)
                for path, value in _leaves(options, f"{section}.{key}") if value == REDACTED]
    if redacted:
        raise ConfigError(
            f"{', '.join(redacted)}: expected a value, found {REDACTED!r}, the mark dyngen "
            "records in place of a credential (this config was copied from a recorded run). "
            "Set the credential in the environment instead (README: Storage backends).")


def _leaves(options: Any, prefix: str) -> list[tuple[str, Any]]:
    if not isinstance(options, Mapping):
        return [(prefix, options)]
    return [leaf for name, value in options.items()
            for leaf in _leaves(value, f"{prefix}.{name}")]


def _env_hint(name: str, root: str) -> str:
    lowered = name.lower()
    scheme = root.split("://", 1)[0].lower() if "://" in root else ""
    if scheme in ("gs", "gcs"):
        return "GOOGLE_APPLICATION_CREDENTIALS (the path of a key file) for " + name
    if scheme in ("az", "abfs", "abfss", "adl"):
        return f"{_AZURE.get(lowered, 'AZURE_STORAGE_*')} for {name}"
    if lowered in _AWS:
        return f"{_AWS[lowered]} for {name}"
    return f"the filesystem's own environment variable or config file for {name}"
