"""A tool-using agent killed with `kill -9` while a tool runs resumes without asking the model
again for the call it had made, and without losing it: the server sees each call once, and each
step is recorded and charged once.

Each run is a `kloop` process (the real CLI, config, agent loop, store and provider); only the
evaluator is the FakeEvaluator, slowed down so the kill lands inside an evaluation.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
from agent_fakes import kernel
from fake_llm_server import FakeLLMServer, anthropic_message, chat_completion
from kloop.agent.store import RunStore
from test_resume_kill import finish, kloop

PLAN = [("evaluate", kernel("BUG")), ("evaluate", kernel(runtime_ms=0.5)),
        ("evaluate", kernel(runtime_ms=0.4)), ("submit", kernel(runtime_ms=0.4))]


def _replies_before(body: dict) -> int:
    return sum(1 for m in body["messages"] if m["role"] == "assistant")


def kill_inside_step(proc, run_dir: Path, step: int) -> None:
    """Kill the run once step `step`'s reply is recorded and its tool is running."""
    calls, turns = run_dir / "calls.jsonl", run_dir / "turns.jsonl"
    count = lambda p, s: p.read_bytes().count(s) if p.exists() else 0  # noqa: E731
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if count(calls, b'"phase":"answered"') >= step and count(turns, b"\n") == step - 1:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed: " + proc.communicate()[0]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_killed_while_a_tool_runs_the_agent_resumes_with_the_recorded_call(tmp_path, provider):
    with FakeLLMServer() as server:
        def answer(rec) -> dict:
            n = _replies_before(rec.body)
            name, code = PLAN[n]
            if provider == "anthropic":
                return anthropic_message(f"reply {n}", tool_calls=[(f"t{n}", name, {"code": code})],
                                         model="claude-sonnet-4-5")
            return chat_completion(f"reply {n}", tool_calls=[(f"c{n}", name, {"code": code})],
                                   model="gpt-4.1")

        server.responder = answer
        model, url = (("openai:gpt-4.1", server.openai_url) if provider == "openai"
                      else ("anthropic:claude-sonnet-4-5", server.url))
        run = tmp_path / "run"
        args = ["run", "-p", "L3/1", "--model", model, "--base-url", url, "-c", "strategy.kind=agent",
                "--turns", 6, "--out", run]
        kill_inside_step(kloop(tmp_path, *args, delay=1.0), run, 2)
        assert len(server.requests) == 2 and len(RunStore.open(run).turns()) == 1
        finish(kloop(tmp_path, "run", "--resume", run))
        # Step 2's call was made once, before the kill; the resumed run used its recorded reply.
        assert len(server.requests) == len(PLAN)
    store = RunStore.open(run)
    turns = store.turns()
    assert [t.turn for t in turns] == [1, 2, 3, 4], "a step was repeated or lost"
    assert [t.reply.text for t in turns] == [f"reply {i}" for i in range(4)]
    assert [t.status for t in turns] == ["incorrect", "correct", "correct", "info"]
    summary = store.summary()
    assert summary.status == "finished" and summary.spend.calls == 4
    # The call cut off by the kill is its step's, not one paid for and left unrecorded.
    assert [e.unrecorded_calls for e in store.episodes()] == [[]]
    assert {c.call_id for c in store.calls()} == {t.call_id for t in turns}
    assert summary.problems[0].best.turn == 3 and summary.problems[0].best.runtime_ms == 0.4
    # The resumed step 3 was sent the conversation rebuilt from the records, step 2's result included.
    resumed = server.requests[2].body["messages"]
    assert _replies_before(server.requests[2].body) == 2
    assert "Step 2 of 6: correct." in json.dumps(resumed)

