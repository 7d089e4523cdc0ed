"""Retries, aborts, timeouts and the concurrency limit, through the real SDKs and a fake server."""

import logging
import threading
import time

import pytest
from fake_llm_server import FakeLLMServer, anthropic_message, chat_completion
from kloop.agent.errors import InfraFault, ProviderAbort, ProviderRetryable
from kloop.agent.models import Message, ModelConfig, get_model
from kloop.agent.retry import retry_after_s

MESSAGES = [Message(role="user", content="Write ModelNew.")]


@pytest.fixture
def server():
    with FakeLLMServer() as s:
        yield s


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-test")
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


def model_for(server: FakeLLMServer, provider: str = "openai", **kw):
    spec = "openai:gpt-4.1" if provider == "openai" else "anthropic:claude-haiku-4-5"
    url = server.openai_url if provider == "openai" else server.url
    kw.setdefault("retry_initial_wait_s", 0.01)
    return get_model(spec, ModelConfig(spec=spec, base_url=url, **kw))


def test_rate_limit_with_retry_after_zero_then_success(server, caplog):
    server.error(429, "Rate limit reached", headers={"retry-after": "0"})
    server.add(chat_completion("ok"))
    with caplog.at_level(logging.WARNING, logger="kloop.agent.retry"):
        reply = model_for(server).query(MESSAGES)
    assert (reply.text, reply.retries, len(server.requests)) == ("ok", 1, 2)
    assert "Rate limit reached" in caplog.text  # logged before sleeping


def test_retry_after_ms_is_a_lower_bound_on_the_wait(server):
    server.error(429, "slow down", headers={"retry-after-ms": "400"})
    server.add(chat_completion("ok"))
    start = time.monotonic()
    reply = model_for(server, retry_initial_wait_s=0.001).query(MESSAGES)
    assert reply.retries == 1 and time.monotonic() - start >= 0.4


@pytest.mark.parametrize(
    "provider, status", [("openai", 500), ("openai", 503), ("anthropic", 500), ("anthropic", 529)]
)
def test_server_errors_and_overload_are_retried(server, provider, status):
    server.error(status, "Overloaded" if status == 529 else "internal error")
    ok = chat_completion("ok") if provider == "openai" else anthropic_message("ok")
    server.add(ok)
    reply = model_for(server, provider).query(MESSAGES)
    assert (reply.text, reply.retries, len(server.requests)) == ("ok", 1, 2)


def test_retries_run_out_and_the_last_error_is_raised(server):
    server.error(529, "Overloaded", times=3)
    with pytest.raises(ProviderRetryable, match="gave up after 3 attempts") as info:
        model_for(server, "anthropic", max_retries=2).query(MESSAGES)
    assert info.value.attempts == 3 and len(server.requests) == 3
    assert info.value.raw["error"]["message"] == "Overloaded"


@pytest.mark.parametrize(
    "provider, status, message, code, kind",
    [
        ("openai", 401, "Incorrect API key provided", None, "auth"),
        (
            "openai",
            400,
            "This model's maximum context length is 128000 tokens",
            "context_length_exceeded",
            "context_length",
        ),
        ("openai", 429, "You exceeded your current quota", "insufficient_quota", "quota"),
        ("openai", 404, "The model `gpt-9` does not exist", "model_not_found", "not_found"),
        (
            "anthropic",
            400,
            "prompt is too long: 210000 tokens > 200000 maximum",
            None,
            "context_length",
        ),
        ("anthropic", 400, "max_tokens: field required", None, "bad_request"),
        ("anthropic", 403, "Your API key does not have permission", None, "auth"),
    ],
)
def test_non_retryable_errors_abort_after_one_request(
    server, provider, status, message, code, kind
):
    server.error(status, message, code=code)
    with pytest.raises(ProviderAbort) as info:
        model_for(server, provider).query(MESSAGES)
    assert len(server.requests) == 1
    assert info.value.kind == kind
    assert message in str(info.value) and f"HTTP {status}" in str(info.value)
    assert isinstance(info.value, InfraFault)


def test_timeouts_are_retried_then_raised(server):
    server.add(chat_completion("too late"), delay_s=1.0, times=2)
    start = time.monotonic()
    with pytest.raises(ProviderRetryable, match="Timeout") as info:
        model_for(server, timeout_s=0.2, max_retries=1).query(MESSAGES)
    assert info.value.attempts == 2 and len(server.requests) == 2
    assert time.monotonic() - start < 1.0


def test_malformed_json_is_retried_and_kept_for_the_log(server):
    server.add("{not json", times=2)
    server.add(chat_completion("ok"))
    with pytest.raises(ProviderRetryable, match="not a JSON object") as info:
        model_for(server, max_retries=0).query(MESSAGES)
    assert info.value.raw == {"unparsed_body": "{not json"}
    assert model_for(server, max_retries=1).query(MESSAGES).retries == 1


def test_concurrency_is_limited_per_endpoint(server):
    server.add(chat_completion("ok"), delay_s=0.15, times=6)
    models = [model_for(server, concurrency=2) for _ in range(3)]  # shared limit across instances
    threads = [threading.Thread(target=models[i % 3].query, args=(MESSAGES,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(server.requests) == 6 and server.max_in_flight == 2


def test_retry_after_header_forms():
    assert retry_after_s({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert retry_after_s({"retry-after": "3"}) == 3.0
    assert 0 <= retry_after_s({"retry-after": "Wed, 21 Oct 2015 07:28:00 GMT"}) <= 0.0
    assert retry_after_s({"retry-after": "soon"}) is None and retry_after_s({}) is None
