"""The tool-using agent through the real openai and anthropic SDKs, against a local server that
answers with tool calls: what each SDK sends (tools, tool calls, their results) and reads back,
then whole agent runs through `kloop run`, `kloop show` and an offline `kloop replay`."""

from __future__ import annotations

import json

import pytest
from agent_fakes import FakeEvaluator, kernel, run_kloop
from fake_llm_server import FakeLLMServer, anthropic_message, chat_completion, responses_body
from kloop.agent import components
from kloop.agent.agentic import TOOLS
from kloop.agent.models import ModelConfig, get_model
from kloop.agent.models.base import Message, ToolCall
from kloop.agent.store import RunStore

WRONG, FAST = kernel("BUG"), kernel(runtime_ms=0.5)
CONVERSATION = [
    Message(role="system", content="You write GPU kernels."),
    Message(role="user", content="Make L3/1 faster."),
    Message(role="assistant", content="Checking the task.",
            tool_calls=[ToolCall(id="c1", name="problem", arguments="{}")]),
    Message(role="tool", tool_call_id="c1", content="The task is ..."),
]


@pytest.fixture
def keys(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")


def test_openai_chat_sends_tools_and_reads_the_call(keys):
    with FakeLLMServer() as server:
        server.add(chat_completion(None, tool_calls=[("c2", "evaluate", {"code": FAST})]))
        model = get_model("openai:gpt-4.1", ModelConfig(spec="openai:gpt-4.1", base_url=server.openai_url))
        reply = model.query(CONVERSATION, tools=TOOLS)
        body = server.requests[0].body
    assert body["tools"][0] == {"type": "function", "function": TOOLS[0].model_dump()}
    assert body["parallel_tool_calls"] is False
    assert body["messages"][2] == {"role": "assistant", "content": "Checking the task.", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "problem", "arguments": "{}"}}]}
    assert body["messages"][3] == {"role": "tool", "tool_call_id": "c1", "content": "The task is ..."}
    assert reply.tool_calls == [ToolCall(id="c2", name="evaluate", arguments=json.dumps({"code": FAST}))]
    assert reply.finish_reason == "tool_calls" and reply.raw["choices"][0]["message"]["tool_calls"]


def test_openai_responses_sends_tools_and_reads_the_call(keys):
    with FakeLLMServer() as server:
        server.add(responses_body("", tool_calls=[("c2", "submit", {"code": FAST})]))
        cfg = ModelConfig(spec="openai:gpt-5", base_url=server.openai_url, api="responses")
        reply = get_model(cfg.spec, cfg).query(CONVERSATION, tools=TOOLS)
        body = server.requests[0].body
    assert server.requests[0].path == "/v1/responses"
    assert body["tools"][3] == {"type": "function", **TOOLS[3].model_dump()}
    assert body["input"][1:] == [
        {"role": "assistant", "content": "Checking the task."},
        {"type": "function_call", "call_id": "c1", "name": "problem", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "The task is ..."}]
    assert reply.tool_calls == [ToolCall(id="c2", name="submit", arguments=json.dumps({"code": FAST}))]
    assert reply.finish_reason == "tool_calls"


def test_anthropic_sends_tools_and_reads_the_call(keys):
    with FakeLLMServer() as server:
        server.add(anthropic_message("Judging it.", tool_calls=[("t2", "evaluate", {"code": FAST})]))
        cfg = ModelConfig(spec="anthropic:claude-sonnet-4-5", base_url=server.url)
        reply = get_model(cfg.spec, cfg).query(CONVERSATION, tools=TOOLS)
        body = server.requests[0].body
    assert body["tools"][1] == {"name": "profile", "description": TOOLS[1].description,
                                "input_schema": TOOLS[1].parameters}
    assert body["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}
    assert body["messages"][1:] == [
        {"role": "assistant", "content": [{"type": "text", "text": "Checking the task."},
                                          {"type": "tool_use", "id": "c1", "name": "problem", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1",
                                      "content": "The task is ..."}]}]
    assert reply.text == "Judging it." and reply.finish_reason == "tool_calls"
    assert reply.tool_calls == [ToolCall(id="t2", name="evaluate", arguments=json.dumps({"code": FAST}))]


# A policy that answers from its context alone, as a real model does: step n (n-1 replies before
# it) makes the n-th call of the plan.
PLAN = [("problem", {}), ("evaluate", {"code": WRONG}), ("evaluate", {"code": FAST}),
        ("profile", {"code": FAST}), ("submit", {"code": FAST})]


def _replies_before(body: dict) -> int:
    if "input" in body:
        return sum(1 for m in body["input"] if m.get("type") == "function_call")
    return sum(1 for m in body["messages"] if m["role"] == "assistant")


def responder(provider: str):
    def answer(rec) -> dict:
        n = _replies_before(rec.body)
        name, args = PLAN[n]
        if provider == "anthropic":
            return anthropic_message(f"step {n + 1}", tool_calls=[(f"toolu_{n}", name, args)],
                                     model="claude-sonnet-4-5")
        return chat_completion(f"step {n + 1}", tool_calls=[(f"call_{n}", name, args)],
                               model="gpt-4.1")
    return answer


@pytest.fixture
def fake_evaluator(monkeypatch):
    ev = FakeEvaluator()
    monkeypatch.setattr(components, "build_evaluator", lambda cfg, problems: ev)
    monkeypatch.setattr("kloop.agent.run.build_evaluator", lambda cfg, problems: ev)
    monkeypatch.setattr("kloop.agent.replay.build_evaluator", lambda cfg, problems: ev)
    return ev


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_an_agent_run_through_each_sdk_shows_and_replays_offline(tmp_path, keys, fake_evaluator,
                                                                    provider):
    run, again = tmp_path / "run", tmp_path / "again"
    with FakeLLMServer() as server:
        server.responder = responder(provider)
        model, url = (("openai:gpt-4.1", server.openai_url) if provider == "openai"
                      else ("anthropic:claude-sonnet-4-5", server.url))
        res = run_kloop("run", "-p", "L3/1", "--model", model, "--base-url", url,
                        "-c", "strategy.kind=agent", "--turns", 8, "--out", run)
        assert res.exit_code == 0, res.output
        assert len(server.requests) == len(PLAN)
        assert all(r.body["tools"] for r in server.requests)
    store = RunStore.open(run)
    turns = store.turns()
    assert [t.tool.name for t in turns] == [name for name, _ in PLAN]
    assert [t.status for t in turns] == ["info", "incorrect", "correct", "info", "info"]
    assert fake_evaluator.calls == [WRONG, FAST]
    summary = store.summary()
    assert summary.spend.calls == 5 and summary.spend.input_tokens == 50
    assert summary.spend.cost_usd > 0 and summary.spend.unpriced_calls == 0
    [ep] = store.episodes()
    assert ep.stop_reason == "submitted" and ep.best.turn == 3

    shown = run_kloop("show", run, "--problem", "L3/1")
    assert shown.exit_code == 0, shown.output
    assert "tool call: evaluate(code)" in shown.output and "tool call: problem()" in shown.output
    assert "judged at an earlier step" in shown.output and "tool result" in shown.output

    # Offline: no server, no key; the recorded replies (tool calls included) drive the loop again.
    replayed = run_kloop("replay", run, "--out", again)
    assert replayed.exit_code == 0, replayed.output
    assert [(t.tool.name, t.status) for t in RunStore.open(again).turns()] == [
        (t.tool.name, t.status) for t in turns]
    report = json.loads((again / "replay_report.json").read_text())
    assert report["differences"] == [] and report["replies_unused"] == 0
