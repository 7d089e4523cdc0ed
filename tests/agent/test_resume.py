"""Resume after a crash: no finished turn lost or repeated; a truncated last line is tolerated."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from agent_fakes import FakeEvaluator, kernel, make_config, reply
from kloop.agent.components import load_problems
from kloop.agent.models.scripted import ScriptedModel
from kloop.agent.store import RunDirError, RunStore
from kloop.agent.strategies import Runner

REPO = Path(__file__).resolve().parents[2]


class Crash(BaseException):
    """Stands in for the process dying: nothing in kloop may catch it."""


class CrashingModel(ScriptedModel):
    def __init__(self, replies, crash_at: int):
        super().__init__(replies)
        self.crash_at = crash_at

    def query(self, messages):
        if len(self.seen) + 1 == self.crash_at:
            raise Crash()
        return super().query(messages)


def replies_for(n: int) -> list[str]:
    return [reply(kernel(runtime_ms=1.0 + i / 10), f"reply {i}") for i in range(n)]


def check_complete(store: RunStore, episodes: int, turns: int) -> None:
    recs = store.turns()
    keys = [(t.episode, t.turn) for t in recs]
    assert len(keys) == len(set(keys)), "a turn was repeated"
    assert sorted(keys) == [(e, t) for e in range(episodes) for t in range(1, turns + 1)]
    latest = {e.episode_key: e for e in store.episodes()}
    assert len(latest) == episodes and all(e.stop_reason == "max_turns" for e in latest.values())
    assert all(e.turns == turns for e in latest.values())


def test_resume_after_a_crash_mid_episode_with_a_truncated_line(tmp_path, caplog):
    cfg = make_config(strategy={"turns": 3, "samples": 2})
    problems = load_problems(cfg)
    store = RunStore.create(tmp_path / "run", cfg)
    # Crash during the 5th call: episode 0 finished (3 turns), episode 1 has 1 turn on disk.
    with pytest.raises(Crash):
        Runner(cfg, store, CrashingModel(replies_for(6), crash_at=5), FakeEvaluator()).run(problems)
    assert [(t.episode, t.turn) for t in store.turns()] == [(0, 1), (0, 2), (0, 3), (1, 1)]
    # The crash also left half a line: the next turn was being written.
    with (store.root / "turns.jsonl").open("a") as f:
        f.write('{"schema_version": 1, "kind": "turn", "run_id": "run", "episode_k')

    # The same script as before: the model continues after the 4 replies already on disk.
    model = ScriptedModel(replies_for(6))
    runner = Runner(cfg, RunStore.open(store.root), model, FakeEvaluator())
    assert "truncated last line" in caplog.text
    runner.run(problems)
    check_complete(store, episodes=2, turns=3)
    assert model.remaining == 0  # exactly the two missing turns were asked for
    # The resumed turn 2 saw turn 1 (from disk) as its history.
    assert model.seen[0][2].content.startswith("reply 3")
    assert (store.root / "turns.jsonl").read_text().endswith("\n")
    # Spend is rebuilt from disk: the run meter counts all 7 calls, the one in flight at the
    # crash included (logged before it was sent; its tokens unknown).
    assert runner.run_meter.spent().calls == 7
    assert RunStore.open(store.root).summary().spend.calls == 7


def test_resume_skips_finished_episodes_and_continues_infra_errors(tmp_path):
    cfg = make_config(strategy={"turns": 2, "samples": 2})
    problems = load_problems(cfg)
    store = RunStore.create(tmp_path / "run", cfg)
    Runner(cfg, store, ScriptedModel(replies_for(3)), FakeEvaluator()).run(problems)
    first = {e.episode: e.stop_reason for e in store.episodes()}
    assert first == {0: "max_turns", 1: "infra_error"}  # the script ran out in episode 1
    model = ScriptedModel(replies_for(4))
    Runner(cfg, RunStore.open(store.root), model, FakeEvaluator()).run(problems)
    check_complete(store, episodes=2, turns=2)
    assert model.remaining == 0


def test_a_damaged_line_in_the_middle_is_an_error_not_a_silent_loss(tmp_path):
    cfg = make_config(strategy={"turns": 2})
    store = RunStore.create(tmp_path / "run", cfg)
    Runner(cfg, store, ScriptedModel(replies_for(2)), FakeEvaluator()).run(load_problems(cfg))
    path = store.root / "turns.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    path.write_text(lines[0][:50] + "\n" + lines[1])
    with pytest.raises(RunDirError, match=r"turns.jsonl:1: not a valid TurnRecord"):
        store.turns()


def test_creating_over_an_existing_run_is_refused(tmp_path):
    cfg = make_config()
    RunStore.create(tmp_path / "run", cfg)
    with pytest.raises(RunDirError, match="--resume"):
        RunStore.create(tmp_path / "run", cfg)


CHILD = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {tests!r})
    from pathlib import Path
    from agent_fakes import FakeEvaluator, kernel, make_config, reply
    from kloop.agent.components import load_problems
    from kloop.agent.models.scripted import ScriptedModel
    from kloop.agent.store import RunStore
    from kloop.agent.strategies import Runner

    class SlowEvaluator(FakeEvaluator):
        def evaluate(self, problem, source):
            time.sleep(0.3)
            return super().evaluate(problem, source)

    cfg = make_config(strategy={{"turns": 4, "samples": 2}})
    store = RunStore.create(Path({root!r}), cfg)
    replies = [reply(kernel(runtime_ms=1 + i / 10), f"reply {{i}}") for i in range(8)]
    Runner(cfg, store, ScriptedModel(replies), SlowEvaluator()).run(load_problems(cfg))
""")


def test_resume_after_kill_9(tmp_path):
    root = tmp_path / "run"
    script = CHILD.format(tests=str(Path(__file__).parent), root=str(root))
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    turns = root / "turns.jsonl"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:
        if turns.exists() and turns.read_text().count("\n") >= 5:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    store = RunStore.open(root)
    done = len(store.turns())
    assert 5 <= done < 8
    cfg = store.config_record().config
    model = ScriptedModel([reply(kernel(runtime_ms=1 + i / 10), f"reply {i}") for i in range(8)])
    Runner(cfg, store, model, FakeEvaluator()).run(load_problems(cfg))
    check_complete(store, episodes=2, turns=4)
    assert model.remaining == 0


def test_records_of_a_newer_schema_are_refused_not_misread(tmp_path):
    cfg = make_config(strategy={"turns": 1})
    store = RunStore.create(tmp_path / "run", cfg)
    Runner(cfg, store, ScriptedModel(replies_for(1)), FakeEvaluator()).run(load_problems(cfg))
    path = store.root / "turns.jsonl"
    path.write_text(path.read_text().replace('"schema_version":1', '"schema_version":99', 1))
    with pytest.raises(RunDirError, match="schema_version 99 is newer"):
        store.turns()
    config = store.root / "config.json"
    config.write_text(config.read_text().replace('"schema_version": 1', '"schema_version": 2', 1))
    with pytest.raises(RunDirError, match="config.json: schema_version 2 is newer"):
        store.config_record()
