"""The `summary` context policy's example config (agent/demo/summary.yaml) end to end through the
CLI: its addressed replies cover every call, the two summaries are recorded on turns 3 and 4 and
charged. The evaluator is the FakeEvaluator (the demo's kernels are judged for real in
test_evaluator_integration.py); what is tested here is the config and its replies."""

from __future__ import annotations

from pathlib import Path

from agent_fakes import FakeEvaluator, run_kloop
from kloop.agent.store import RunStore

REPO = Path(__file__).resolve().parents[2]


def test_the_summary_example_condenses_older_turns_with_recorded_calls(tmp_path, monkeypatch):
    ev = FakeEvaluator()
    monkeypatch.setattr("kloop.agent.run.build_evaluator", lambda cfg, problems: ev)
    monkeypatch.chdir(REPO)  # the config names its replies relative to the repository root
    out = tmp_path / "summary"
    res = run_kloop("run", "-c", "agent/demo/summary.yaml", "--out", out)
    assert res.exit_code == 0, res.output
    turns = RunStore.open(out).turns()
    assert [t.turn for t in turns] == [1, 2, 3, 4]
    assert [t.summary is not None for t in turns] == [False, False, True, True]
    assert "unclosed parenthesis" in turns[3].summary.text
    assert turns[3].summary.text in "\n".join(m.content for m in turns[3].messages)
    assert RunStore.open(out).summary().spend.calls == 6
