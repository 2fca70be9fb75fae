"""The solve-rate stage when the policy is in trouble (down, refusing, slow, killed mid-round)
and when nothing can grade a row: the round fails before committing anything, or quarantines
only the rows whose requests failed; the key is found nowhere."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from dyngen.errors import ConfigError, ModelError, ModelUnavailableError
from dyngen.flows.generation_round import generation_round
from dyngen.server.processes import free_port
from dyngen.store import verify
from tests.llm.llama_server import LlamaServer
from tests.llm.scripted_server import scripted_server
from tests.llm.support import KEY, KEY_ENV
from tests.llm.support_solve_rate import key_found_in, solve_round_config, store_files, sums_store
from tests.llm.test_served_rounds import kill_once_busy

pytestmark = pytest.mark.usefixtures("prefect_server")
TRIGGER = {"event_id": "batch-9", "step": 9}


def test_a_policy_that_is_down_fails_the_round_fast_and_commits_nothing(tmp_path: Path) -> None:
    store = sums_store(tmp_path)
    before = store_files(store)
    url = f"http://127.0.0.1:{free_port()}/v1"
    cfg = solve_round_config(store, {"endpoint": url, "api_key_env": KEY_ENV})
    started = time.monotonic()
    state = generation_round("sums", cfg, TRIGGER, return_state=True)
    assert state.is_failed() and time.monotonic() - started < 60
    with pytest.raises(ModelUnavailableError, match="unreachable") as err:
        state.result()
    assert url in str(err.value) and "round.solve_rate.endpoint" in str(err.value)
    assert store.head_version("sums") == 0 and store_files(store) == before
    assert key_found_in(state, store, KEY) == []


def test_a_policy_answering_400_to_most_requests_fails_the_round(tmp_path: Path) -> None:
    store = sums_store(tmp_path)
    before = store_files(store)
    # The first reply answers dyngen's one probe of n; every chat after it is refused.
    with scripted_server(["ok"] + [400] * 20) as (url, script):
        cfg = solve_round_config(store, {"endpoint": url, "api_key_env": KEY_ENV})
        state = generation_round("sums", cfg, TRIGGER, return_state=True)
    assert state.is_failed()
    with pytest.raises(ModelError, match="more than half") as err:
        state.result()
    assert "bad_request: 6" in str(err.value)
    assert store.head_version("sums") == 0 and store_files(store) == before
    assert script.headers and all(h["authorization"] == f"Bearer {KEY}" for h in script.headers)
    assert key_found_in(state, store, KEY) == []


def test_one_refused_request_quarantines_its_row_as_model_error(tmp_path: Path) -> None:
    store = sums_store(tmp_path)
    with scripted_server(["ok", 400]) as (url, _):
        cfg = solve_round_config(store, {"endpoint": url, "api_key_env": KEY_ENV,
                                         "keep": [0.0, 1.0]})
        state = generation_round("sums", cfg, TRIGGER, return_state=True)
    assert state.is_completed(), state.message
    rejected = store.load_rejected("sums", 1, round_only=True).to_list()
    assert [r["reason"] for r in rejected] == ["model_error"]
    assert "bad_request" in rejected[0]["detail"] and "HTTP 400" in rejected[0]["detail"]
    lineage = store.head("sums").lineage
    assert lineage["solve_rate"]["model_error"] == 1 and lineage["counts"]["kept"] == 5
    assert lineage["solve_rate"]["n_in_one_request"] is True  # this server counts n's tokens
    assert verify(store, "sums") == [] and key_found_in(state, store, KEY) == []


def test_a_policy_that_times_out_fails_the_round_and_commits_nothing(tmp_path: Path) -> None:
    store = sums_store(tmp_path)
    before = store_files(store)
    with scripted_server(["ok"] + ["slow"] * 20, sleep_seconds=3) as (url, _):
        cfg = solve_round_config(store, {"endpoint": url, "api_key_env": KEY_ENV,
                                         "request_timeout_seconds": 0.5, "max_retries": 0})
        state = generation_round("sums", cfg, TRIGGER, return_state=True)
    assert state.is_failed()
    with pytest.raises(ModelUnavailableError, match="timeout: 6"):
        state.result()
    assert store.head_version("sums") == 0 and store_files(store) == before
    assert key_found_in(state, store, KEY) == []


def test_a_policy_killed_mid_round_fails_it_and_the_retry_commits_nothing(tmp_path: Path) -> None:
    server = LlamaServer(tmp_path, parallel=1, ctx=1024, key=KEY).start()
    try:
        store = sums_store(tmp_path)
        before = store_files(store)
        cfg = solve_round_config(store, {"endpoint": server.url, "api_key_env": KEY_ENV,
                                         "max_tokens": 48, "max_concurrency": 1,
                                         "max_retries": 1}, tasks=4)
        cfg["round"].update(retries=1, retry_delay_seconds=0)
        killer = kill_once_busy(server)
        state = generation_round("sums", cfg, TRIGGER, return_state=True)
        killer.join(timeout=1)
        assert server.process is not None and server.process.poll() is not None, "not killed"
    finally:
        server.stop()
    assert state.is_failed()
    with pytest.raises(ModelUnavailableError) as err:
        state.result()
    assert server.url in str(err.value)
    assert store.head_version("sums") == 0 and verify(store, "sums") == []
    assert store_files(store) == before  # no shard, no quarantine, no record
    assert key_found_in(state, store, KEY) == []


def test_rows_nothing_can_grade_are_refused_before_any_request(tmp_path: Path) -> None:
    store = sums_store(tmp_path)
    store.create("mine", [{**row, "data_source": "my-benchmark"}
                          for row in store.load("sums").to_list()[:2]])
    before = store_files(store)
    with scripted_server() as (url, script):
        cfg = solve_round_config(store, {"endpoint": url, "api_key_env": KEY_ENV},
                                 datagen={"path": "pkg://dyngen.generators.base",
                                          "name": "MockDataGenerator"},
                                 dedup=False, near_duplicate={"enabled": False})
        state = generation_round("mine", cfg, TRIGGER, return_state=True)
    assert state.is_failed()
    with pytest.raises(ConfigError) as err:
        state.result()
    message = str(err.value)
    assert "'my-benchmark'" in message and "round.solve_rate.reward.path" in message
    assert script.chats == 0  # not one completion asked for
    assert store.head_version("mine") == 0 and store_files(store) == before
