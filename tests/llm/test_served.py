"""ServedChatModel against a real llama.cpp server (xllamacpp) and, for what only a server in
trouble does (slow answers, 429, 503), a scripted HTTP server on a real socket."""

from __future__ import annotations

import asyncio
import time

import pytest

from dyngen.errors import ConfigError, ModelError, ModelUnavailableError
from dyngen.llm import ChatRequest, chat_model
from dyngen.server.processes import free_port
from tests.llm.llama_server import MODEL_ALIAS, LlamaServer
from tests.llm.scripted_server import scripted_server
from tests.llm.support import KEY, KEY_ENV, served

STORY = [{"role": "user", "content": "Tell me a long story about a dragon and a knight."}]
TOO_LONG = [{"role": "user", "content": "word " * 1500}]  # > the slot's 1024 tokens


def test_it_takes_the_served_model_name_and_records_only_scheme_host_and_port(
        llama: LlamaServer) -> None:
    with chat_model(served(llama)) as model:
        model.check()
        assert model.name == MODEL_ALIAS  # the first of GET /v1/models
        result, = model.complete([ChatRequest(STORY, max_tokens=3)])
    assert result.ok and result.texts[0] and result.completion_tokens > 0
    usage = model.usage.as_dict()
    assert usage["backend"] == "served" and usage["model"] == MODEL_ALIAS
    assert usage["endpoint"] == f"http://127.0.0.1:{llama.port}"
    assert KEY not in repr(usage)


def test_n_samples_count_every_choices_tokens(llama: LlamaServer) -> None:
    # llama.cpp answers n choices in one request but counts one choice's tokens: the client
    # finds that out (once) and asks for the samples one by one, so each is counted.
    with chat_model(served(llama)) as model:
        result, = model.complete([ChatRequest(STORY, n=3, max_tokens=4, temperature=1.0,
                                              seed=11)])
        assert model.n_in_one_request is False
    assert result.ok and len(result.texts) == 3
    assert result.completion_tokens == 3 * 4  # every sample ran to max_tokens
    assert model.usage.completion_tokens == 12 and model.usage.requests == 1


def test_a_prompt_longer_than_the_context_fails_alone_without_retries(
        llama: LlamaServer) -> None:
    with chat_model(served(llama, max_retries=3)) as model:
        long, short = model.complete([ChatRequest(TOO_LONG, max_tokens=2),
                                      ChatRequest(STORY, max_tokens=2)])
    assert not long.ok and long.error.startswith("bad_request: HTTP 400")
    assert "context" in long.error and not long.texts
    assert short.ok
    assert model.usage.failures == 1 and model.usage.errors == {"bad_request": 1}
    assert model.usage.retries == 0  # a 400 is not retried


def test_most_requests_failing_raises_instead_of_returning(llama: LlamaServer) -> None:
    with chat_model(served(llama)) as model, pytest.raises(ModelError) as err:
        model.complete([ChatRequest(TOO_LONG, max_tokens=2)] * 2
                       + [ChatRequest(STORY, max_tokens=2)])
    assert not isinstance(err.value, ModelUnavailableError)  # a retry would fail the same
    assert "2 of 3 requests" in str(err.value) and "bad_request: 2" in str(err.value)


def test_a_wrong_key_is_refused_naming_its_variable_not_the_key(
        llama: LlamaServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(KEY_ENV, "sk-wrong-key-123")
    with chat_model(served(llama)) as model, pytest.raises(ModelError) as err:
        model.check()
    assert f"${KEY_ENV}" in str(err.value) and "401" in str(err.value)
    assert "sk-wrong-key-123" not in str(err.value)


def test_an_unreachable_endpoint_fails_the_check_at_once_naming_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    started = time.monotonic()
    with chat_model({"endpoint": url, "api_key_env": KEY_ENV}) as model, \
            pytest.raises(ModelUnavailableError) as err:
        model.check()
    assert time.monotonic() - started < 10
    assert url in str(err.value) and "unreachable" in str(err.value)
    assert KEY not in str(err.value)


@pytest.mark.parametrize(("cfg", "expected"), [
    ({"endpoint": "http://user:sk-in-url@host:8000/v1"}, "without credentials"),
    ({"endpoint": "gpu-host:8000"}, "http(s) base URL"),
    ({"endpoint": "http://h/v1", "api_key_env": "sk-live-abc-def"}, "NAME of an environment"),
    ({"endpoint": "http://h/v1", "api_key_env": "DYNGEN_NO_SUCH_VAR"}, "is not set"),
    ({"endpoint": "http://h/v1", "max_concurrency": 0}, "max_concurrency"),
    ({"endpoint": "http://h/v1", "request_timeout_seconds": -1}, "request_timeout_seconds"),
    ({"endpoint": "http://h/v1", "request_timeout_seconds": "soon"}, "request_timeout_seconds"),
])
def test_bad_settings_are_refused_without_echoing_a_secret(cfg: dict, expected: str) -> None:
    with pytest.raises(ConfigError, match=expected.replace("(", r"\(").replace(")", r"\)")) \
            as err:
        chat_model(cfg)
    assert "sk-" not in str(err.value)


def test_a_request_past_its_timeout_is_retried_then_dropped_alone() -> None:
    with scripted_server(sleep_seconds=5) as (url, _), chat_model(
            {"endpoint": url, "request_timeout_seconds": 0.5, "max_retries": 1}) as model:
        started = time.monotonic()
        slow, fast, other = model.complete([
            ChatRequest([{"role": "user", "content": "be slow"}], max_tokens=4),
            ChatRequest(STORY, max_tokens=4), ChatRequest(STORY, max_tokens=4)])
        took = time.monotonic() - started
    assert fast.ok and other.ok
    assert not slow.ok and slow.error.startswith("timeout: no answer within 0.5 s")
    assert model.usage.retries == 1 and model.usage.errors == {"timeout": 1}
    assert took < 4  # two attempts of 0.5 s and a short backoff, not the server's 5 s


def test_429_and_5xx_are_retried_with_backoff_and_400_is_not() -> None:
    with scripted_server([429, 503, "ok", 400]) as (url, script), chat_model(
            {"endpoint": url, "max_retries": 2, "max_concurrency": 1}) as model:
        first, = model.complete([ChatRequest(STORY, max_tokens=4)])
        refused, answered = model.complete([ChatRequest(STORY, max_tokens=4)] * 2)
    assert first.ok and first.texts == ("answer 0",)
    assert model.usage.retries == 2 and script.chats == 5
    assert refused.error.startswith("bad_request: HTTP 400") and answered.ok


def test_failures_that_may_pass_on_a_retry_raise_model_unavailable() -> None:
    with scripted_server([503] * 6) as (url, _), \
            chat_model({"endpoint": url, "max_retries": 1}) as model, \
            pytest.raises(ModelUnavailableError, match=r"3 of 3 .*server_error: 3"):
        model.complete([ChatRequest(STORY, max_tokens=4)] * 3)


def test_no_more_than_max_concurrency_requests_are_in_flight() -> None:
    with scripted_server(sleep_seconds=0.3) as (url, script), \
            chat_model({"endpoint": url, "max_concurrency": 3}) as model:
        results = model.complete([ChatRequest([{"role": "user", "content": f"slow {i}"}])
                                  for i in range(9)])
    assert all(r.ok for r in results)
    assert script.most_in_flight == 3


def test_n_goes_in_one_request_where_the_server_counts_every_choice() -> None:
    from dyngen.llm.served import ServedChatModel

    with scripted_server() as (url, script), ServedChatModel({"endpoint": url}) as model:
        result, = model.complete([ChatRequest(STORY, n=4, seed=5)])
        assert model.n_in_one_request is True
    assert result.texts == tuple(f"answer {i}" for i in range(4))
    assert result.completion_tokens == 8
    assert [b.get("n", 1) for b in script.bodies] == [2, 4]  # the probe, then one request


def test_the_key_goes_to_the_server_as_a_bearer_token_and_nowhere_else() -> None:
    with scripted_server() as (url, script), \
            chat_model({"endpoint": url, "api_key_env": KEY_ENV}) as model:
        model.complete([ChatRequest(STORY)])
    assert script.headers[-1]["authorization"] == f"Bearer {KEY}"
    assert KEY not in repr(vars(model)) and KEY not in repr(model.usage.as_dict())


def test_complete_works_from_inside_a_running_event_loop(llama: LlamaServer) -> None:
    async def in_a_task() -> list:
        with chat_model(served(llama)) as model:
            return model.complete([ChatRequest(STORY, max_tokens=2)])

    result, = asyncio.run(in_a_task())
    assert result.ok


def test_a_served_solver_beside_an_in_process_proposer() -> None:
    with scripted_server() as (url, script), chat_model(
            {"solver_endpoint": url, "solver_api_key_env": KEY_ENV}, "solver") as solver:
        result, = solver.complete([ChatRequest(STORY)])
    assert solver.backend == "served" and solver.name == "scripted" and result.ok
    assert script.headers[-1]["authorization"] == f"Bearer {KEY}"
