"""Providers end to end: the real openai/anthropic SDKs against a local fake server."""

import json

import pytest
from fake_llm_server import FakeLLMServer, anthropic_message, chat_completion, responses_body
from kloop.agent.errors import ProviderAbort, ScriptExhausted
from kloop.agent.models import Message, ModelConfig, ModelReply, Usage, get_model
from kloop.agent.models.scripted import ScriptedModel
from kloop.agent.pricing import load_prices

KEY = "sk-test-DO-NOT-LOG-4242"
MESSAGES = [
    Message(role="system", content="You write GPU kernels."),
    Message(role="user", content="Write ModelNew."),
    Message(role="assistant", content="```python\nclass ModelNew: ...\n```"),
    Message(role="user", content="It failed to compile."),
]


@pytest.fixture
def server():
    with FakeLLMServer() as s:
        yield s


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


def config(spec: str, base_url: str | None, **kw) -> ModelConfig:
    return ModelConfig(spec=spec, base_url=base_url, retry_initial_wait_s=0.01, **kw)


def query(spec: str, base_url: str | None, **kw) -> ModelReply:
    return get_model(spec, config(spec, base_url, **kw)).query(MESSAGES)


def test_openai_chat_reply_usage_cost_and_request(server):
    server.add(
        chat_completion(
            "```python\nx = 1\n```",
            prompt_tokens=1000,
            completion_tokens=500,
            cached_tokens=200,
            model="gpt-4.1-2025-04-14",
        )
    )
    reply = query("openai:gpt-4.1", server.openai_url, temperature=0.3, max_output_tokens=4000)

    assert reply.text == "```python\nx = 1\n```"
    assert reply.finish_reason == "stop" and reply.reasoning is None
    assert reply.usage == Usage(input_tokens=1000, output_tokens=500, cached_tokens=200)
    assert reply.model == "gpt-4.1-2025-04-14"  # the dated snapshot still finds its price
    assert reply.cost_usd == pytest.approx((800 * 2.0 + 200 * 0.5 + 500 * 8.0) / 1e6)
    assert reply.raw["choices"][0]["message"]["content"] == reply.text
    assert reply.retries == 0 and reply.latency_s > 0

    (req,) = server.requests
    assert req.path == "/v1/chat/completions"
    assert req.headers["authorization"] == f"Bearer {KEY}"
    assert req.body["model"] == "gpt-4.1"
    assert req.body["messages"] == [m.model_dump() for m in MESSAGES]
    assert req.body["temperature"] == 0.3
    assert req.body["max_tokens"] == 4000  # a non-OpenAI base URL gets the widely known field
    assert "reasoning_effort" not in req.body


def test_openai_responses_api_sends_effort_and_returns_reasoning_summary(server):
    server.add(
        responses_body(
            "final answer",
            summary=["Tile the matmul.", "Fuse the ReLU."],
            input_tokens=2000,
            output_tokens=900,
            reasoning_tokens=600,
            cached_tokens=1000,
            model="gpt-5-2025-08-07",
        )
    )
    reply = query(
        "openai:gpt-5", server.openai_url, reasoning_effort="high", max_output_tokens=16000
    )

    (req,) = server.requests
    assert req.path == "/v1/responses"
    assert req.body["reasoning"] == {"effort": "high", "summary": "auto"}
    assert req.body["instructions"] == "You write GPU kernels."
    assert req.body["input"] == [m.model_dump() for m in MESSAGES[1:]]
    assert req.body["max_output_tokens"] == 16000
    assert req.body["store"] is False and "temperature" not in req.body

    assert reply.text == "final answer"
    assert reply.reasoning == "Tile the matmul.\n\nFuse the ReLU."
    assert reply.usage == Usage(
        input_tokens=2000, output_tokens=900, reasoning_tokens=600, cached_tokens=1000
    )
    # reasoning tokens are inside output_tokens and billed once, as output
    assert reply.cost_usd == pytest.approx((1000 * 1.25 + 1000 * 0.125 + 900 * 10.0) / 1e6)


def test_openai_api_choice(server):
    server.add(responses_body("a", status="incomplete", incomplete_reason="max_output_tokens"))
    server.add(chat_completion("b", finish_reason="length"))
    # o-series names pick the Responses API by themselves; api="chat" forces Chat Completions
    assert query("openai:o3", server.openai_url).finish_reason == "length"
    assert query("openai:o3", server.openai_url, api="chat", reasoning_effort="low").text == "b"
    assert [r.path for r in server.requests] == ["/v1/responses", "/v1/chat/completions"]
    assert server.requests[0].body["reasoning"] == {"summary": "auto"}
    assert server.requests[1].body["reasoning_effort"] == "low"


def test_compatible_server_via_env_without_key(server, monkeypatch):
    monkeypatch.setenv("OPENAI_BASE_URL", server.openai_url)
    monkeypatch.delenv("OPENAI_API_KEY")
    body = chat_completion(
        "```python\ny = 2\n```", reasoning_content="Think first.", model="deepseek-reasoner"
    )
    body["usage"]["prompt_cache_hit_tokens"] = 7  # DeepSeek's own cache field
    del body["usage"]["prompt_tokens_details"]
    server.add(body)

    reply = query("openai:deepseek-reasoner", None)

    assert server.requests[0].headers["authorization"] == "Bearer EMPTY"
    assert reply.reasoning == "Think first."
    assert reply.usage.cached_tokens == 7
    assert reply.cost_usd == pytest.approx((3 * 0.28 + 7 * 0.028 + 20 * 0.42) / 1e6)


def test_openai_empty_content_and_refusal(server):
    server.add(chat_completion(None))
    server.add(chat_completion(None, refusal="I can't help with that."))
    empty = query("openai:gpt-4.1", server.openai_url)
    refused = query("openai:gpt-4.1", server.openai_url)
    assert (empty.text, empty.finish_reason) == ("", "stop")
    assert (refused.text, refused.finish_reason) == ("I can't help with that.", "refusal")


def test_unknown_model_costs_none_until_priced(server, tmp_path):
    server.add(chat_completion("x", model="my-local-model"), times=3)
    assert query("openai:my-local-model", server.openai_url).cost_usd is None

    inline = {"my-local-model": {"input": 1.0, "output": 2.0}}
    reply = query("openai:my-local-model", server.openai_url, prices=inline)
    assert reply.cost_usd == pytest.approx((10 * 1.0 + 20 * 2.0) / 1e6)

    table = tmp_path / "prices.json"
    table.write_text(
        json.dumps({"version": "mine", "models": {"my-local-model": {"input": 3, "output": 4}}})
    )
    reply = query("openai:my-local-model", server.openai_url, prices=table)
    assert reply.cost_usd == pytest.approx((10 * 3 + 20 * 4) / 1e6)
    assert load_prices(table).version == "mine" and load_prices(inline).version.endswith("+user")


def test_anthropic_thinking_usage_and_request(server):
    server.add(
        anthropic_message(
            "```python\nz = 3\n```",
            thinking="The conv can be fused.",
            input_tokens=100,
            cache_read_tokens=900,
            output_tokens=3000,
            thinking_tokens=2500,
            model="claude-sonnet-4-6",
        )
    )
    server.add(anthropic_message("cut", stop_reason="max_tokens"))
    spec = "anthropic:claude-sonnet-4-6"
    model = get_model(
        spec, config(spec, server.url, thinking_budget_tokens=4096, max_output_tokens=8192)
    )

    reply = model.query(MESSAGES)
    assert reply.text == "```python\nz = 3\n```"
    assert reply.reasoning == "The conv can be fused."
    assert reply.finish_reason == "stop"
    assert reply.usage == Usage(
        input_tokens=1000, output_tokens=3000, reasoning_tokens=2500, cached_tokens=900
    )
    assert reply.cost_usd == pytest.approx((100 * 3.0 + 900 * 0.3 + 3000 * 15.0) / 1e6)
    assert model.query(MESSAGES).finish_reason == "length"

    req = server.requests[0]
    assert req.path == "/v1/messages"
    assert req.body["system"] == "You write GPU kernels."
    assert req.body["messages"] == [m.model_dump() for m in MESSAGES[1:]]
    assert req.body["thinking"] == {"type": "enabled", "budget_tokens": 4096}
    assert req.body["max_tokens"] == 8192 and "temperature" not in req.body


@pytest.mark.parametrize(
    "overrides, match",
    [
        ({"thinking_budget_tokens": 8192, "max_output_tokens": 8192}, "must be below"),
        ({"thinking_budget_tokens": 2048, "temperature": 0.5}, "temperature"),
    ],
)
def test_anthropic_rejects_inconsistent_thinking_config(overrides, match):
    with pytest.raises(ValueError, match=match):
        get_model("anthropic:claude-sonnet-4-5", ModelConfig(spec="anthropic:x", **overrides))


def test_api_key_is_sent_but_never_recorded(server):
    server.add(chat_completion("a"))
    server.add(anthropic_message("b"))
    replies = [
        query("openai:gpt-4.1", server.openai_url),
        query("anthropic:claude-haiku-4-5", server.url),
    ]
    assert all(KEY in json.dumps(r.headers) for r in server.requests)
    assert all(KEY not in r.model_dump_json() for r in replies)


def test_missing_key_is_a_clear_abort(monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY")
    with pytest.raises(ProviderAbort, match="OPENAI_API_KEY is not set"):
        get_model("openai:gpt-5", ModelConfig(spec="openai:gpt-5"))


def test_scripted_model_from_yaml_and_json(tmp_path):
    path = tmp_path / "replies.yaml"
    path.write_text(
        "- first reply\n"
        "- text: second\n"
        "  reasoning: because\n"
        "  finish_reason: length\n"
        "  cost_usd: 0.25\n"
        "  usage: {input_tokens: 5, output_tokens: 7}\n"
    )
    model = get_model(f"scripted:{path}", ModelConfig(spec=f"scripted:{path}"))
    first, second = model.query(MESSAGES), model.query(MESSAGES[:2])
    assert (first.text, first.cost_usd, first.usage, first.finish_reason) == (
        "first reply",
        0.0,
        Usage(),
        "stop",
    )
    assert (second.text, second.reasoning, second.finish_reason) == ("second", "because", "length")
    assert (second.usage.output_tokens, second.cost_usd) == (7, 0.25)
    assert [len(m) for m in model.seen] == [4, 2]
    with pytest.raises(ScriptExhausted, match="all 2 scripted replies"):
        model.query(MESSAGES)

    as_json = tmp_path / "replies.json"
    as_json.write_text(json.dumps({"replies": ["only"]}))
    assert ScriptedModel.from_file(as_json).query(MESSAGES).text == "only"


def test_scripted_model_in_code_and_bad_entries(tmp_path):
    recorded = ModelReply(
        text="t",
        usage=Usage(input_tokens=1),
        cost_usd=0.5,
        finish_reason="stop",
        latency_s=2.0,
        model="gpt-5",
        raw={"id": "x"},
    )
    assert ScriptedModel(replies=[recorded]).query(MESSAGES) == recorded
    with pytest.raises(ValueError, match="scripted reply 1"):
        ScriptedModel(replies=["ok", {"txt": "typo"}])
    bad = tmp_path / "bad.yaml"
    bad.write_text("text: not a list\n")
    with pytest.raises(ValueError, match="must hold a list"):
        ScriptedModel.from_file(bad)


@pytest.mark.parametrize(
    "spec, match", [("gpt-5", "provider:name"), ("gemini:pro", "unknown model provider")]
)
def test_bad_specs(spec, match):
    with pytest.raises(ValueError, match=match):
        get_model(spec, ModelConfig(spec=spec))
