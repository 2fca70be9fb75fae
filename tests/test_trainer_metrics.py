"""One rule for a batch end's metrics on every trainer path: the store's own check.

A metric the store takes (a real number, numpy's included, finite as a float) reaches the
store's inbox and the event alike; one it refuses (a bool, NaN, inf, an int past any float,
text, a name it cannot hold) is left out everywhere, said once, and never raises in the
trainer. Real stores in tmp_path; the events as a real Prefect server stored them.
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path

import numpy as np
import pytest

import dyngen.trainers.events as events
import dyngen.trainers.inbox_write as inbox_write
from dyngen.errors import BatchEndError
from dyngen.store import Store
from dyngen.store.inbox_input import MAX_METRICS, check_metrics
from dyngen.trainers.spread import finite
from dyngen.trainers.verl_follow import trigger_metrics
from tests.rows import verl_rows
from tests.support import server_triggers

VALUES = {"np_int": np.int64(7), "np_uint": np.uint8(3), "np_float32": np.float32(0.5),
          "np_float": np.float64(0.25), "int": 2, "float": 1.5,
          "bool": True, "np_bool": np.bool_(False), "nan": float("nan"),
          "np_nan": np.float64("nan"), "inf": float("inf"), "np_inf": np.float32("-inf"),
          "huge": 10**400, "huger": 10**5000, "text": "0.5", "none": None}
TAKEN = {"np_int": 7.0, "np_uint": 3.0, "np_float32": 0.5, "np_float": 0.25, "int": 2.0,
         "float": 1.5}


@pytest.fixture(autouse=True)
def nothing_said_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inbox_write, "_said", set())
    monkeypatch.setattr(inbox_write, "_stores", {})


@pytest.fixture
def store(tmp_path: Path) -> Store:
    store = Store(tmp_path / "store")
    store.create("ds", verl_rows(2))
    return store


def store_takes(name: object, value: object) -> bool:
    try:
        check_metrics({name: value})
    except BatchEndError:
        return False
    return True


def test_every_check_agrees_with_the_store() -> None:
    for name, value in VALUES.items():
        assert finite(value) == store_takes(name, value) == (name in TAKEN), name
    assert inbox_write.store_metrics(VALUES)[0] == TAKEN
    assert events.batch_end_payload(1, VALUES)["trigger"]["metrics"] == TAKEN
    assert trigger_metrics(VALUES) == TAKEN  # `dyngen follow` for verl (TRL's: `finite`)
    # A name the store cannot hold is left out, not the batch end.
    assert inbox_write.store_metrics({7: 1.0, "": 1.0, "x" * 201: 1.0, "ok": 1.0})[0] == \
        {"ok": 1.0}


def test_the_store_and_the_event_get_the_same_metrics_and_nothing_raises(
        store: Store, prefect_server: None, caplog: pytest.LogCaptureFixture) -> None:
    from prefect.settings import PREFECT_API_URL

    caplog.set_level(logging.WARNING, logger="dyngen")
    live = str(PREFECT_API_URL.value())
    name = f"metrics-{uuid.uuid4().hex[:8]}"
    store.create(name, verl_rows(2))
    sent = events.send_batch_end(name, 1, VALUES, store=store, run="r")
    assert (sent.inbox, sent.status) == ("written", "sent")
    assert dict(Store(store.root).batch_end(name, "r", 1).metrics) == TAKEN
    assert server_triggers(live, name, 1)[0]["metrics"] == TAKEN
    said = [r.getMessage() for r in caplog.records if "not what the store takes" in
            r.getMessage()]
    assert len(said) == 1, said
    assert "bool=True" in said[0] and "nan=nan" in said[0] and "huger=<int>" in said[0]
    # Without a store, the event alone: the same metrics, the same rule.
    alone = f"metrics-{uuid.uuid4().hex[:8]}"
    assert events.send_batch_end(alone, 1, VALUES).status == "sent"
    assert server_triggers(live, alone, 1)[0]["metrics"] == TAKEN


def test_past_the_stores_limit_the_first_metrics_are_kept_not_the_batch_end_dropped(
        store: Store, no_server: None) -> None:
    many = {f"m{i:04d}": float(i) for i in range(MAX_METRICS + 5)}
    sent = events.send_batch_end("ds", 1, many, store=store, run="r")
    assert sent.inbox == "written"
    kept = dict(Store(store.root).batch_end("ds", "r", 1).metrics)
    assert kept == {f"m{i:04d}": float(i) for i in range(MAX_METRICS)}
    assert [dict(e.metrics) for e in Store(store.root).pending("ds")] == [kept]  # a round's
