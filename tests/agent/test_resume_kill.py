"""Resume after a real `kill -9`, for every provider: the run continues where it stopped.

Each run is a `kloop` process (the real CLI, config, loop, store and provider); only the
evaluator is the FakeEvaluator, slowed down so the kill lands between turns. The replies are
distinct and only the last two are correct, so a resumed run that starts the script again
(the defect: turns 3 and 4 got the kernels of turns 1 and 2) ends "none correct".
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import yaml
from agent_fakes import kernel, reply
from fake_llm_server import FakeLLMServer, anthropic_message, chat_completion

from kloop.agent.store import RunStore

REPO = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parent
REPLIES = [reply(kernel("BUG"), "reply 0"), reply(kernel("BUG"), "reply 1"),
           reply(kernel(runtime_ms=0.5), "reply 2"), reply(kernel(runtime_ms=0.4), "reply 3")]
EXPECTED = ["incorrect", "incorrect", "correct", "correct"]

CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    from agent_fakes import FakeEvaluator
    import kloop.agent.replay, kloop.agent.run
    from kloop import agent
    evaluator = FakeEvaluator(delay_s={delay})
    agent.run.build_evaluator = lambda cfg, problems: evaluator
    agent.replay.build_evaluator = lambda cfg, problems: evaluator
    from kloop.agent.cli import main
    main(sys.argv[1:])
""")


def kloop(tmp_path: Path, *args: object, delay: float = 0.0) -> subprocess.Popen:
    script = tmp_path / f"child_{delay}.py"
    script.write_text(CHILD.format(tests=str(TESTS), delay=delay))
    env = {**os.environ, "PYTHONPATH": str(REPO), "OPENAI_API_KEY": "", "ANTHROPIC_API_KEY": ""}
    return subprocess.Popen([sys.executable, str(script), *map(str, args)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    return out


def kill_after_turns(proc: subprocess.Popen, run_dir: Path, turns: int) -> None:
    path = run_dir / "turns.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if path.exists() and path.read_bytes().count(b"\n") >= turns:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed: " + proc.communicate()[0]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def check_resumed(run_dir: Path) -> None:
    turns = RunStore.open(run_dir).turns()
    assert [t.turn for t in turns] == [1, 2, 3, 4], "a turn was repeated or lost"
    assert [t.reply.text.splitlines()[0] for t in turns] == [f"reply {i}" for i in range(4)]
    assert [t.status for t in turns] == EXPECTED
    summary = RunStore.open(run_dir).summary()
    assert summary.status == "finished" and summary.problems[0].best is not None



def test_scripted(tmp_path):
    script = tmp_path / "replies.yaml"
    script.write_text(yaml.safe_dump(REPLIES))
    run = tmp_path / "run"
    args = ["run", "-p", "L3/1", "--model", f"scripted:{script}", "--turns", 4, "--out", run]
    kill_after_turns(kloop(tmp_path, *args, delay=0.5), run, 2)
    assert len(RunStore.open(run).turns()) in (2, 3)
    finish(kloop(tmp_path, "run", "--resume", run))
    check_resumed(run)


def test_replay(tmp_path):
    script = tmp_path / "replies.yaml"
    script.write_text(yaml.safe_dump(REPLIES))
    source, again = tmp_path / "source", tmp_path / "again"
    finish(kloop(tmp_path, "run", "-p", "L3/1", "--model", f"scripted:{script}", "--turns", 4,
                 "--out", source))
    kill_after_turns(kloop(tmp_path, "replay", source, "--out", again, delay=0.5), again, 2)
    finish(kloop(tmp_path, "run", "--resume", again))
    check_resumed(again)


def _assistant_turns(body: dict) -> int:
    return sum(1 for m in body["messages"] if m["role"] == "assistant")


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_http_provider(tmp_path, provider):
    with FakeLLMServer() as server:
        if provider == "openai":
            server.responder = lambda rec: chat_completion(REPLIES[_assistant_turns(rec.body)])
            model, url = "openai:gpt-4.1", server.openai_url
        else:
            server.responder = lambda rec: anthropic_message(REPLIES[_assistant_turns(rec.body)])
            model, url = "anthropic:claude-sonnet-4-5", server.url
        run = tmp_path / "run"
        args = ["run", "-p", "L3/1", "--model", model, "--base-url", url, "--turns", 4, "--out", run]
        kill_after_turns(kloop(tmp_path, *args, delay=0.5), run, 2)
        finish(kloop(tmp_path, "run", "--resume", run))
        check_resumed(run)
        # Each resumed query carried the turns before it, rebuilt from the records.
        resumed = server.requests[-1].body
        assert _assistant_turns(resumed) == 3
        assert any("reply 2" in str(m["content"]) for m in resumed["messages"])


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_a_call_killed_during_its_evaluation_is_counted(tmp_path, provider):
    """Killed while turn 3's kernel is judged: its call was answered, its turn never written.
    Resume asks again, and the totals count both calls, as the provider did."""
    with FakeLLMServer() as server:
        if provider == "openai":
            server.responder = lambda rec: chat_completion(REPLIES[_assistant_turns(rec.body)])
            model, url = "openai:gpt-4.1", server.openai_url
        else:
            server.responder = lambda rec: anthropic_message(REPLIES[_assistant_turns(rec.body)])
            model, url = "anthropic:claude-sonnet-4-5", server.url
        run = tmp_path / "run"
        proc = kloop(tmp_path, "run", "-p", "L3/1", "--model", model, "--base-url", url,
                     "--turns", 4, "--out", run, delay=2.0)
        deadline = time.monotonic() + 60
        while len(server.requests) < 3 and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.02)
        time.sleep(0.5)  # the reply is back; the evaluation takes 2 s
        assert proc.poll() is None and len(server.requests) == 3
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        assert len(RunStore.open(run).turns()) == 2
        finish(kloop(tmp_path, "run", "--resume", run))
        check_resumed(run)
        store = RunStore.open(run)
        assert len(server.requests) == 5
        assert store.summary().spend.calls == 5
        orphan = [e for e in store.episodes() if e.unrecorded_calls]
        assert len(orphan) == 1 and orphan[0].unrecorded_spend.calls == 1
        assert orphan[0].unrecorded_spend.input_tokens > 0  # what the answered call reported
        # The turn loop asks again rather than reuse a reply: its log keeps none.
        assert all(c.reply is None for c in store.calls())
