"""A trigger's rollouts file: only inside the allowed folders, only a regular file under the
bound, checked again once opened, and no error ever quotes what the file holds."""

from __future__ import annotations

import json
import os
import threading
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

from dyngen.config import load_config
from dyngen.errors import ConfigError, RolloutsError
from dyngen.rollout_format import parse_rollouts
from dyngen.round.rollouts import RolloutsPolicy
from dyngen.trainers.rollouts import rollouts_dir

SECRET = "SECRET_TOKEN=sk-live-5f0c2a9e77d41b3c"


@pytest.fixture
def allowed(tmp_path: Path) -> Path:
    folder = tmp_path / "rollouts"
    (folder / "ds").mkdir(parents=True)
    return folder


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "secret.env"
    path.write_text(SECRET + "\n")
    return path


def policy(allowed: Path, max_bytes: int = 4096) -> RolloutsPolicy:
    return RolloutsPolicy((str(allowed),), max_bytes)


def leaks(exc: BaseException) -> bool:
    """Whether any part of the secret is in the error, its chain or its traceback."""
    text = "".join(traceback.format_exception(exc))
    return any(SECRET[i:i + 8] in text for i in range(len(SECRET) - 7))


def test_a_file_in_an_allowed_folder_is_read_as_rollouts(allowed: Path) -> None:
    path = allowed / "ds" / "batch-3.jsonl"
    path.write_text(json.dumps({"prompt": "What is 2 + 2?", "score": 0.25, "uid": "a"}) + "\n\n"
                    + json.dumps({"prompt": [{"role": "user", "content": "Add 3 and 4."}],
                                  "score": 1, "ground_truth": "7"}) + "\n")
    first, second = policy(allowed).read(str(path))
    assert (first.line, first.prompt, first.score, first.ground_truth) == (
        1, "What is 2 + 2?", 0.25, None)
    assert first.record["uid"] == "a"  # other fields are kept
    assert (second.line, second.score, second.ground_truth) == (3, 1.0, "7")


def test_the_default_folder_is_rollouts_under_the_store_root_where_trainers_write(
        tmp_path: Path) -> None:
    cfg = load_config(overrides=[f"store.root={tmp_path / 'store'}"])
    default = RolloutsPolicy.from_config(cfg)
    assert default.dirs == (str(tmp_path / "store" / "rollouts"),)
    # Where the trainer integrations (dyngen follow, TRL) write theirs.
    inside = rollouts_dir(tmp_path / "store", "ds", "run-1") / "b.jsonl"
    inside.parent.mkdir(parents=True)
    inside.write_text('{"prompt": "x?", "score": 0}\n')
    assert default.check(str(inside)) == str(inside)
    beside = tmp_path / "store" / "b.jsonl"
    beside.write_text('{"prompt": "x?", "score": 0}\n')
    with pytest.raises(RolloutsError, match="outside the allowed directories"):
        default.check(str(beside))


def _link(allowed: Path, secret: Path) -> str:
    (allowed / "ds" / "notes.jsonl").symlink_to(secret)
    return str(allowed / "ds" / "notes.jsonl")


def _fifo(allowed: Path, secret: Path) -> str:
    os.mkfifo(allowed / "ds" / "pipe.jsonl")
    return str(allowed / "ds" / "pipe.jsonl")


def _big(allowed: Path, secret: Path) -> str:
    (allowed / "ds" / "big.jsonl").write_text((SECRET + "\n") * 200)
    return str(allowed / "ds" / "big.jsonl")


REFUSED: dict[str, tuple[Callable[[Path, Path], str], str]] = {
    "outside": (lambda a, s: str(s), "is outside the allowed directories"),
    "dot-dot out of the folder": (lambda a, s: f"{a}/ds/../../{s.name}", "is outside the allowed"),
    "a link to a secret": (_link, "is outside the allowed directories"),
    "/dev/zero": (lambda a, s: "/dev/zero", "is outside the allowed directories"),
    "a FIFO": (_fifo, "is a FIFO (named pipe); expected a regular JSONL file"),
    "a folder": (lambda a, s: str(a / "ds"), "is a directory; expected a regular"),
    "over the bound": (_big, "over the bound round.max_rollouts_bytes=4096"),
    "missing": (lambda a, s: str(a / "ds" / "none.jsonl"), "does not exist"),
    "relative": (lambda a, s: "ds/b.jsonl", "expected an absolute path"),
    "empty": (lambda a, s: "", "expected a file path"),
}


@pytest.mark.parametrize("case", REFUSED)
def test_anything_but_an_allowed_small_regular_file_is_refused_before_a_read(
        case: str, allowed: Path, secret: Path) -> None:
    make, wording = REFUSED[case]
    path = make(allowed, secret)
    for attempt in (policy(allowed).check, policy(allowed).read):
        exc = raised_within(attempt, path)
        assert isinstance(exc, RolloutsError), exc
        assert wording in str(exc)
        assert not leaks(exc)
    if "outside" in wording:
        assert str(allowed) in str(exc)  # names where rollouts may be


def raised_within(attempt: Callable[[str], object], path: str,
                  seconds: float = 10) -> BaseException:
    """What `attempt(path)` raised, failing if it returned or blocked (a FIFO read would
    wait for a writer forever)."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            attempt(path)
        except BaseException as exc:  # noqa: BLE001  (the test inspects what was raised)
            outcome.append(exc)
        else:
            outcome.append(None)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout=seconds)
    assert not worker.is_alive(), f"{attempt.__name__}({path!r}) blocked"
    assert outcome[0] is not None, f"{path!r} was accepted"
    return outcome[0]


def test_no_folder_configured_refuses_every_path(allowed: Path) -> None:
    with pytest.raises(RolloutsError, match="none configured: set round.rollouts_dirs"):
        RolloutsPolicy().check(str(allowed / "ds" / "b.jsonl"))


def test_a_folder_that_is_a_url_is_a_config_error(allowed: Path) -> None:
    with pytest.raises(ConfigError, match=r"round.rollouts_dirs\[0\]: expected a local folder"):
        RolloutsPolicy(("s3://bucket/rollouts",)).check(str(allowed / "b.jsonl"))


SWAPS = {"a link to rollouts outside": "could not be opened",
         "a FIFO": "is a FIFO", "a file over the bound": "over the bound"}


@pytest.mark.parametrize("swap", SWAPS)
def test_a_file_swapped_after_the_check_is_refused_once_opened(
        swap: str, allowed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = allowed / "ds" / "b.jsonl"
    path.write_text('{"prompt": "x?", "score": 0}\n')
    outside = tmp_path / "outside.jsonl"  # valid rollouts: only the confinement refuses it
    outside.write_text(json.dumps({"prompt": SECRET, "score": 0}) + "\n")
    checked = RolloutsPolicy.check

    def check_then_swap(self: RolloutsPolicy, given: str) -> str:
        real = checked(self, given)
        path.unlink()
        if swap == "a FIFO":
            os.mkfifo(path)
        elif swap == "a link to rollouts outside":
            path.symlink_to(outside)
        else:
            path.write_text(json.dumps({"prompt": "y?", "score": 0}) + "\n" * 5000)
        return real

    monkeypatch.setattr(RolloutsPolicy, "check", check_then_swap)
    exc = raised_within(policy(allowed).read, str(path))
    assert isinstance(exc, RolloutsError) and SWAPS[swap] in str(exc), exc
    assert not leaks(exc)


BAD_LINES = {
    "not JSON": (SECRET, "line 2: expected a JSON object", "found text that is not JSON"),
    "a JSON list": (json.dumps([SECRET]), "line 2: expected a JSON object", "found a list"),
    "no score": (json.dumps({"prompt": SECRET}), "line 2: field 'score' is missing", ""),
    "score is text": (json.dumps({"prompt": "q?", "score": SECRET}),
                      "line 2: field 'score' must be a finite number", "found a string"),
    "score is NaN": ('{"prompt": "q?", "score": NaN}', "field 'score' must be a finite number",
                     "not finite"),
    "prompt is a number": (json.dumps({"prompt": 3, "score": 1}), "field 'prompt' must be",
                           "found a number"),
    "a message without text": (json.dumps({"prompt": [{"role": "user", "content": None},
                                                      {"role": SECRET}], "score": 1}),
                               "field 'prompt' must be", "an item that is not"),
    "nested too deeply": ("[" * 100_000, "line 2: expected a JSON object",
                          "nested too deeply"),
}


@pytest.mark.parametrize("case", BAD_LINES)
def test_a_bad_line_is_named_by_number_and_field_never_quoted(case: str) -> None:
    line, where, found = BAD_LINES[case]
    data = ('{"prompt": "fine?", "score": 0.5}\n' + line + "\n").encode()
    with pytest.raises(RolloutsError) as raised:
        parse_rollouts(data, "trigger.rollouts '/r/b.jsonl'")
    assert where in str(raised.value) and found in str(raised.value)
    assert not leaks(raised.value)


def test_bytes_that_are_not_utf8_are_named_by_line_not_shown() -> None:
    data = b'{"prompt": "q?", "score": 1}\n\n' + SECRET.encode() + b"\xff\xfe\n"
    with pytest.raises(RolloutsError, match="line 3: expected UTF-8 text") as raised:
        parse_rollouts(data)
    assert not leaks(raised.value)
