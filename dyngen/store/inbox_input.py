"""What a trainer may write into a dataset's inbox: metrics and rollouts, checked and encoded.

Everything is checked before anything is written, and each error says what was expected,
what was found (its kind, never a secret's text) and what to do.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import uuid
from collections.abc import Mapping
from typing import Any

from dyngen.store.covered import BatchEndError

MAX_ROLLOUTS_BYTES = 64 * 1024 * 1024  # as a round's `round.max_rollouts_bytes` default
MAX_METRICS = 1024
MAX_TEXT = 200  # metric names and event ids


def check_metrics(metrics: Any) -> dict[str, float]:
    """Metrics as {name: finite float}, else BatchEndError naming the faulty one."""
    if metrics is None:
        return {}
    if not isinstance(metrics, Mapping):
        raise BatchEndError(f"metrics: expected a mapping of names to numbers, found "
                            f"{type(metrics).__name__}. Pass e.g. {{'reward/mean': 0.4}}.")
    if len(metrics) > MAX_METRICS:
        raise BatchEndError(f"metrics: expected at most {MAX_METRICS} of them, found "
                            f"{len(metrics)}. Send the ones a generator reads.")
    out = {}
    for name, value in metrics.items():
        if not isinstance(name, str) or not name or len(name) > MAX_TEXT:
            raise BatchEndError(f"metrics: expected names of 1-{MAX_TEXT} characters, found "
                                f"{type(name).__name__} {str(name)[:40]!r}. Rename it.")
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            raise BatchEndError(f"metric {name!r}: expected a finite number, found "
                                f"{type(value).__name__}. Send numbers only.")
        try:
            number = float(value)
        except OverflowError:  # an int beyond any float
            number = math.inf
        if not math.isfinite(number):
            raise BatchEndError(f"metric {name!r}: expected a finite number, found {number}. "
                                "Leave it out of this batch end, or send a finite value.")
        out[name] = number
    return out


def check_event_id(event_id: Any) -> str:
    """The event id given (non-empty text), or a new one."""
    if event_id is None:
        return uuid.uuid4().hex
    if not isinstance(event_id, str) or not event_id.strip() or len(event_id) > MAX_TEXT:
        raise BatchEndError(f"event_id: expected 1-{MAX_TEXT} characters of text (or None "
                            f"for a new one), found {type(event_id).__name__} "
                            f"{str(event_id)[:40]!r}.")
    return event_id


def rollouts_payload(rollouts: Any) -> tuple[bytes | None, int]:
    """Rollouts as JSONL bytes and their count: from a list of JSON values, an Arrow table,
    a datasets.Dataset, or a local JSONL file (a path); (None, 0) for none."""
    if rollouts is None:
        return None, 0
    if isinstance(rollouts, (str, os.PathLike)):
        return _file_payload(os.fspath(rollouts))
    if hasattr(rollouts, "to_pylist"):  # an Arrow table
        rollouts = rollouts.to_pylist()
    elif hasattr(rollouts, "to_list") and not isinstance(rollouts, (list, tuple)):
        rollouts = rollouts.to_list()  # a datasets.Dataset
    if not isinstance(rollouts, (list, tuple)):
        raise BatchEndError(f"rollouts: expected a list of JSON values (one per rollout), a "
                            f"table, or the path of a JSONL file, found "
                            f"{type(rollouts).__name__}.")
    lines, size = [], 0
    for at, row in enumerate(rollouts):
        try:
            line = json.dumps(row, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        except (TypeError, ValueError, RecursionError) as exc:
            reason = ("a number that is not finite" if "Out of range" in str(exc) else
                      f"a value JSON cannot hold ({type(exc).__name__}: {str(exc)[:80]})")
            raise BatchEndError(f"rollouts[{at}]: expected a JSON value (objects, lists, text, "
                                f"finite numbers, true/false/null), found {reason}. Convert "
                                "it (e.g. .tolist(), str()) or leave it out.") from None
        size += len(line.encode()) + 1
        if size > MAX_ROLLOUTS_BYTES:
            raise BatchEndError(_too_large(f"rollouts up to [{at}]", size))
        lines.append(line)
    return "".join(f"{line}\n" for line in lines).encode(), len(lines)


def _file_payload(path: str) -> tuple[bytes, int]:
    try:
        size = os.stat(path).st_size
        if size > MAX_ROLLOUTS_BYTES:
            raise BatchEndError(_too_large(f"rollouts file {path!r}", size))
        with open(path, "rb") as fh:
            data = fh.read(MAX_ROLLOUTS_BYTES + 1)
    except OSError as exc:
        raise BatchEndError(f"rollouts file {path!r}: expected a readable JSONL file, found "
                            f"{exc.strerror or exc}. Pass the path the trainer wrote.") from None
    if len(data) > MAX_ROLLOUTS_BYTES:
        raise BatchEndError(_too_large(f"rollouts file {path!r}", len(data)))
    try:
        rows = jsonl_rows(data)
    except BatchEndError as exc:
        raise BatchEndError(f"rollouts file {path!r}: {exc}") from None
    return data, len(rows)


def jsonl_rows(data: bytes) -> list[Any]:
    """JSON values from JSONL bytes (blank lines skipped)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise BatchEndError("expected UTF-8 JSONL text, found other bytes.") from None
    rows = []
    for number, line in enumerate(text.split("\n"), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except (ValueError, RecursionError):
                raise BatchEndError(f"line {number}: expected one JSON value per line, found "
                                    "text that is not JSON.") from None
    return rows


def _too_large(what: str, size: int) -> str:
    return (f"{what}: expected at most {MAX_ROLLOUTS_BYTES:,} bytes of JSONL, found {size:,} "
            "or more. Send fewer rollouts, or a sample of them.")
