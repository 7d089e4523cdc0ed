"""Tree search: every turn a node under the turn it continues, expanded by UCT score, within the
budgets, rebuilt the same after a crash, drawn by `kloop show --tree`, forked at any node."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from agent_fakes import EAGER_MS, FakeEvaluator, kernel, make_config, make_runner, reply, run_kloop
from kloop.agent import replay as replay_lib
from kloop.agent.components import load_problems
from kloop.agent.config import ConfigError
from kloop.agent.models.scripted import ScriptedModel
from kloop.agent.records import NodeAddress, TurnRef
from kloop.agent.replay_cli import fork_point
from kloop.agent.store import RunStore
from kloop.agent.strategies import Runner

# What each episode's reply holds (every episode here runs one turn unless a test says otherwise):
# speedups vs eager 1x, 2x, wrong, 4x, syntax error, 2.5x.
BODIES = [kernel(runtime_ms=2.0), kernel(runtime_ms=1.0), kernel("BUG"), kernel(runtime_ms=0.5),
          kernel("SYNTAX"), kernel(runtime_ms=0.8)]
TREE = {"kind": "tree", "roots": 2, "expansions": 4, "exploration": 0.5, "max_children": 2}


def script(turns: int = 1, bodies: list[str] = BODIES) -> list[dict]:
    """One reply per (episode, turn), addressed, its text naming its place."""
    return [{"at": {"problem": "L3/1", "episode": e, "turn": t}, "text": reply(b, f"ep {e} turn {t}")}
            for e, b in enumerate(bodies) for t in range(1, turns + 1)]


def tree_run(tmp_path, run_id="run", strategy=TREE, **layer):
    turns = strategy.get("turns", 1)
    runner, scripted = make_runner(tmp_path, script(turns), run_id=run_id, strategy=strategy, **layer)
    runner.run(load_problems(runner.cfg))
    return runner, scripted


def parents(store: RunStore) -> dict[tuple[int, int], tuple[int, int] | None]:
    """(episode, turn) -> the (episode, turn) of the node it continues, from the records alone."""
    turns = store.turns()
    where = {(t.episode_key, t.turn): (t.episode, t.turn) for t in turns}
    return {(t.episode, t.turn): where[(t.parent.episode_key, t.parent.turn)] if t.parent else None
            for t in turns}


def value(status: str, speedup: float | None) -> float:
    """The node value as StrategyConfig documents it, written out again here."""
    if status == "correct":
        return 0.5 + 0.5 * speedup / (1 + speedup)
    return {"incorrect": 0.3, "compile_error": 0.05}[status]


@pytest.mark.parametrize(("strategy", "expected"), [
    # c=0.5: step 2 goes back to root 0 (its bonus beats root 1's higher value), then to 0's 4x
    # child, then to root 1 again, which still has room for a second child.
    ({}, {2: 1, 3: 0, 4: 3, 5: 1}),
    # One child per node: root 1 is full after step 1, so step 4 takes the wrong kernel of 2.
    ({"max_children": 1}, {2: 1, 3: 0, 4: 3, 5: 2}),
    # No exploration: always the best open node; 1 gets both its children, then 3 (4x) twice.
    ({"exploration": 0.0}, {2: 1, 3: 1, 4: 3, 5: 3}),
])
def test_each_expansion_continues_the_node_the_score_picks(tmp_path, strategy, expected):
    runner, model = tree_run(tmp_path, strategy={**TREE, **strategy})
    store = runner.store
    assert len(model.seen) == 6 and len(store.episodes()) == 6
    links = parents(store)
    assert links[(0, 1)] is None and links[(1, 1)] is None  # roots start from scratch
    assert {e: links[(e, 1)][0] for e in range(2, 6)} == expected
    # Each child's prompt carries its parent's trajectory, root first.
    turns = {t.episode: t for t in store.turns()}
    for e, p in expected.items():
        shown = [m.content.split("\n")[0] for m in turns[e].messages if m.role == "assistant"]
        chain = [p] if links[(p, 1)] is None else [links[(p, 1)][0], p]
        assert shown == [f"ep {c} turn 1" for c in chain]
    # The episode record names the same parent as its first turn.
    for ep in store.episodes():
        assert ep.parent == turns[ep.episode].parent


def uct_by_hand(e: int, nodes: list[int], links: dict, turns: dict) -> float:
    """value + c*sqrt(ln N(parent) / N(node)), N counting the nodes of a subtree (root: all + 1)."""
    def size(n: int) -> int:
        return 1 + sum(size(c) for c in nodes if links[(c, 1)] == (n, 1))

    p = links[(e, 1)]
    n_parent = size(p[0]) if p else len(nodes) + 1
    ev = turns[e].eval
    return value(ev.status, ev.speedup_vs_eager) + 0.5 * math.sqrt(math.log(n_parent) / size(e))


def test_every_pick_has_the_highest_uct_score_among_open_nodes(tmp_path):
    """The picks, checked against UCT computed here from the records alone."""
    runner, _ = tree_run(tmp_path)
    turns = {t.episode: t for t in runner.store.turns()}
    links = parents(runner.store)
    assert turns[1].eval.speedup_vs_eager == EAGER_MS / 1.0
    for step in range(2, 6):
        nodes = list(range(step))  # the nodes there were when episode `step` was started
        open_ = [e for e in nodes if turns[e].code is not None
                 and sum(links[(c, 1)] == (e, 1) for c in nodes) < 2]
        assert links[(step, 1)] == (max(open_, key=lambda e: uct_by_hand(e, nodes, links, turns)), 1)


def test_the_tree_stops_at_the_run_budget_and_each_expansion_at_the_episode_budget(tmp_path):
    runner, model = tree_run(tmp_path, budget={"run": {"calls": 4}})
    assert len(model.seen) == 4 and len(runner.store.turns()) == 4
    assert runner.skipped >= 1 and runner.store.summary().status == "budget"

    replies = script(turns=3)
    runner, model = make_runner(tmp_path, replies, run_id="episode-budget",
                                strategy={**TREE, "turns": 3}, budget={"episode": {"calls": 2}})
    runner.run(load_problems(runner.cfg))
    eps = runner.store.episodes()
    assert len(eps) == 6 and {e.turns for e in eps} == {2}
    assert {e.stop_reason for e in eps} == {"budget"} and len(model.seen) == 12


class Crash(BaseException):
    """The process dying: nothing in kloop catches it."""


class CrashingModel(ScriptedModel):
    def __init__(self, replies, crash_at: int):
        super().__init__(replies)
        self.crash_at = crash_at

    def query_at(self, messages, at):
        if len(self.seen) + 1 == self.crash_at:
            raise Crash()
        return super().query_at(messages, at)


def test_a_tree_run_resumed_after_a_crash_grows_the_same_tree(tmp_path):
    """Two turns per expansion; the crash cuts episode 3 after its first turn. Resumed, the run
    makes the same picks from the records on disk and asks only for the missing turns."""
    strategy = {**TREE, "turns": 2}
    whole, _ = make_runner(tmp_path, script(turns=2), run_id="whole", strategy=strategy)
    whole.run(load_problems(whole.cfg))

    cfg = make_config(strategy=strategy)
    store = RunStore.create(tmp_path / "crashed", cfg)
    with pytest.raises(Crash):
        Runner(cfg, store, CrashingModel(script(turns=2), crash_at=8), FakeEvaluator()).run(load_problems(cfg))
    assert sorted((t.episode, t.turn) for t in store.turns())[-1] == (3, 1)
    model = ScriptedModel(script(turns=2))
    Runner(cfg, RunStore.open(store.root), model, FakeEvaluator()).run(load_problems(cfg))
    assert len(model.seen) == 12 - 7
    assert parents(store) == parents(whole.store)
    assert sorted(t.code for t in store.turns()) == sorted(t.code for t in whole.store.turns())
    assert {e.episode_key for e in store.episodes()} == {e.episode_key for e in whole.store.episodes()}


def test_show_draws_the_tree(tmp_path):
    runner, _ = tree_run(tmp_path)
    out = run_kloop("show", runner.store.root, "--tree")
    assert out.exit_code == 0, out.output
    nodes = [(m.start(1), m.group(1)) for line in out.stdout.splitlines()
             if (m := re.search(r"[├└]─ (\d+:\d+) ", line))]
    # Depth first, children in the order they were made; each indented under its parent.
    assert [n for _, n in nodes] == ["0:1", "3:1", "4:1", "1:1", "2:1", "5:1"]
    depth = {n: d for d, n in nodes}
    assert depth["0:1"] == depth["1:1"] < depth["3:1"] == depth["2:1"] == depth["5:1"] < depth["4:1"]
    assert "3:1 correct 4x" in out.stdout and "<- best" in out.stdout


def test_fork_at_a_node_inside_the_tree_continues_its_whole_trajectory(tmp_path):
    """Node 3:1 has a child (4:1) and a parent (0:1): the fork's model sees 0:1 then 3:1."""
    runner, _ = tree_run(tmp_path)
    other = ScriptedModel([reply(kernel(runtime_ms=0.25), "forked")])
    fork = replay_lib.fork(runner.store.root, tmp_path / "fork", NodeAddress(episode=3, turn=1),
                           layers=[{"strategy": {"kind": "sequential", "turns": 1}}], model=other,
                           evaluator=FakeEvaluator())
    (ep,) = fork.store.episodes()
    source = {t.episode: t for t in runner.store.turns()}
    assert ep.parent == TurnRef(episode_key=source[3].episode_key, turn=1) and ep.episode == 3
    shown = [m.content.split("\n")[0] for m in other.seen[0] if m.role == "assistant"]
    assert shown == ["ep 0 turn 1", "ep 3 turn 1"]
    assert "Turn 3 of 3" in fork.store.turns()[0].feedback
    assert fork.store.config_record().fork_at == NodeAddress(episode=3, turn=1)
    # A node that is not there forks nothing.
    empty = replay_lib.fork(runner.store.root, tmp_path / "none", NodeAddress(episode=9, turn=1),
                            layers=[], model=ScriptedModel([]), evaluator=FakeEvaluator())
    assert empty.store.turns() == []


def test_fork_at_parses_a_turn_or_a_node():
    assert fork_point("2") == 2 and fork_point("3:1") == NodeAddress(episode=3, turn=1)
    for bad in ("x", "3:", "3:0", "-1"):
        with pytest.raises(ConfigError, match="--fork-at"):
            fork_point(bad)


def test_tree_settings_are_validated():
    assert make_config(strategy={"kind": "tree"}).strategy.turns == 1
    with pytest.raises(ConfigError, match="samples must be 1"):
        make_config(strategy={"kind": "tree", "samples": 2})
    with pytest.raises(ConfigError, match="strategy.max_children"):
        make_config(strategy={"kind": "tree", "max_children": 0})
    with pytest.raises(ConfigError, match="strategy.exploration"):
        make_config(strategy={"kind": "tree", "exploration": -1})


def test_a_batch_step_spreads_its_picks(tmp_path):
    """Two picks per step: the second counts the first as a visit, so it goes elsewhere."""
    runner, _ = tree_run(tmp_path, strategy={**TREE, "batch": 2, "expansions": 2})
    links = parents(runner.store)
    assert links[(2, 1)] != links[(3, 1)]
    assert {e.round for e in runner.store.episodes()} == {0, 1}


def test_the_report_draws_the_tree_beside_beam_and_sequential_at_matched_budgets(tmp_path):
    """Three strategies of 6 calls each over the same replies: the report reads them at equal
    budgets and draws the tree run's tree."""
    from kloop.agent.report.build import build_report, write_report

    flat = [reply(b, f"reply {i}") for i, b in enumerate(BODIES)]
    dirs = []
    for name, strategy in [("sequential", {"kind": "sequential", "turns": 6}),
                           ("beam", {"kind": "beam", "beam_width": 1, "expand": 2, "rounds": 3})]:
        runner, _ = make_runner(tmp_path, flat, run_id=name, strategy=strategy)
        runner.run(load_problems(runner.cfg))
        dirs.append(runner.store.root)
    dirs.append(tree_run(tmp_path, run_id="tree")[0].store.root)
    report = build_report(dirs, n_boot=0)
    assert [r.strategy.split()[0] for r in report.runs] == ["sequential", "beam", "tree"]
    assert [r.spend.calls for r in report.runs] == [6, 6, 6]
    assert report.runs[0].trees == {} and report.runs[1].trees == {}
    rows = report.runs[2].trees["L3/1"]
    assert [r.node for r in rows] == ["0:1", "3:1", "4:1", "1:1", "2:1", "5:1"]
    assert [r.node for r in rows if r.best] == ["3:1"]
    at_six = [m for m in report.matched if m.axis == "calls" and m.budget == 6]
    assert [row.label for row in at_six[0].rows] == ["sequential", "beam", "tree"]
    md = (tmp_path / "rep" / "report.md")
    write_report(report, md.parent)
    text = md.read_text()
    assert "Search tree of L3/1" in text and "tree roots=2 expansions=4" in text
    # Indented with no-break spaces, which Markdown keeps: 4:1 under 3:1 under root 0.
    assert "| │\u00a0\u00a0\u00a0\u00a0\u00a0└─\u00a04:1 | compile_error |" in text
    assert "│\u00a0\u00a0└─\u00a03:1 (best) | correct | 4x |" in text


def test_the_example_sweep_compares_the_three_strategies_and_reports_the_tree(tmp_path):
    """agent/demo/search.yaml (its scripted replies, a fake evaluator): every cell spends the
    same 4 calls, and the report of the experiment draws the tree of each tree cell."""
    import shutil

    import yaml
    from kloop.agent.components import build_model
    from kloop.agent.report.build import build_report
    from kloop.agent.sweep import run_sweep

    demo = Path(__file__).resolve().parents[2] / "agent" / "demo"
    data = yaml.safe_load((demo / "search.yaml").read_text())
    data["sweep"]["out"] = str(tmp_path / "exp")
    data["sweep"]["base"]["model"]["spec"] = f"scripted:{demo / 'replies.yaml'}"
    shutil.copy(demo / "demo.yaml", tmp_path / "demo.yaml")
    (tmp_path / "search.yaml").write_text(yaml.safe_dump(data))
    outcomes = run_sweep(tmp_path / "search.yaml",
                         components=lambda cfg, problems: (build_model(cfg), FakeEvaluator()))
    assert len(outcomes) == 6 and {o.status for o in outcomes} == {"finished"}
    report = build_report([tmp_path / "exp"], n_boot=0)
    assert {r.spend.calls for r in report.runs} == {4}
    trees = {r.label: r.trees for r in report.runs if r.strategy.startswith("tree")}
    assert len(trees) == 2 and all(len(t["L3/1"]) == 4 for t in trees.values())
    assert {r.context for r in report.runs} == {"full", "digest=1"}
    assert any(m.axis == "calls" and m.budget == 4 and len(m.rows) == 6 for m in report.matched)


def test_replay_of_a_tree_run_grows_the_same_tree(tmp_path):
    runner, _ = tree_run(tmp_path)
    report = replay_lib.replay(runner.store.root, tmp_path / "again", evaluator=FakeEvaluator())
    assert report.differences == [] and report.replies_unused == 0
    assert parents(RunStore.open(tmp_path / "again")) == parents(runner.store)


def test_records_from_before_turns_carried_their_parent_make_the_same_tree(tmp_path):
    """Older runs: a turn's parent is its episode's previous turn, or the episode record's parent."""
    from kloop.agent.tree import Tree

    runner, _ = tree_run(tmp_path, strategy={**TREE, "turns": 2}, run_id="two")
    turns, episodes = runner.store.turns(), runner.store.episodes()
    assert len(turns) == 12 and {e.stop_reason for e in episodes} == {"max_turns"}
    now = Tree(turns).rows()
    old = [t.model_copy(update={"parent": None}) for t in turns]
    assert Tree(old, {e.episode_key: e.parent for e in episodes}).rows() == now
    assert len(Tree(old).top) == 6  # without the episode records, every episode is a root


def test_on_cpu_nodes_are_valued_and_drawn_by_cpu_time(tmp_path):
    """A host clock records no speedup; the ratio of CPU times still tells a 2 ms kernel from
    a 0.5 ms one, labelled as not comparable."""
    from kloop.agent.tree import Tree, draw, node_value

    runner, _ = make_runner(tmp_path, script(), evaluator=FakeEvaluator(comparable=False),
                            strategy=TREE)
    runner.run(load_problems(runner.cfg))
    turns = {(t.episode, t.turn): t for t in runner.store.turns()}
    assert all(t.eval.speedup_vs_eager is None for t in turns.values() if t.eval is not None)
    slow, fast = turns[0, 1], turns[3, 1]  # 2.0 ms and 0.5 ms against eager's 2.0 ms
    assert node_value(fast) == pytest.approx(value("correct", 4.0))
    assert node_value(slow) == pytest.approx(value("correct", 1.0))
    lines = draw(Tree(list(turns.values())).rows(), "L3/1")
    assert any("3:1 correct 4x (CPU time, not comparable)" in line for line in lines), lines
