"""KernelEnv (gymnasium) and its reward: the turn loop's prompts, extraction and feedback as an
environment, with the FakeEvaluator where the evaluator is not under test and the real one on
CPU (Triton interpreter) for the example script and batched steps."""

from __future__ import annotations

import math
import subprocess
import sys
import warnings
from pathlib import Path

import gymnasium
import pytest
from agent_fakes import EAGER_MS, FakeEvaluator, kernel, make_config, reply, with_interval
from gymnasium.utils.env_checker import check_env

from kloop.agent.components import load_problems
from kloop.agent.config import AgentConfig
from kloop.agent.rl import RewardConfig
from kloop.agent.rl.env import KernelEnv, step_many
from kloop.agent.rl.reward import reward, speedup_of
from kloop.agent.store import RunStore
from kloop.errors import KloopError

REPO = Path(__file__).resolve().parents[2]
PROBLEMS = load_problems(make_config(problems=["L3/1", "L3/2"]))


def make_env(**kw) -> KernelEnv:
    return KernelEnv(kw.pop("evaluator", FakeEvaluator()), PROBLEMS, **kw)


def test_it_is_a_gymnasium_env_that_passes_the_env_checker():
    env = make_env()
    assert isinstance(env, gymnasium.Env)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # only "no spec to test render modes with"
        check_env(env)


def test_reset_gives_the_turn_loops_messages_and_step_its_feedback_and_reward():
    env = make_env(max_turns=3)
    obs, info = env.reset(options={"problem": "L3/2"})
    assert info == {"problem_id": "L3/2", "turn": 0}
    assert [m["role"] for m in obs] == ["system", "user"] and "2_ShallowWideMLP" in obs[1]["content"]
    assert env.observation_space.contains(obs)

    obs, r, terminated, truncated, info = env.step(reply(kernel("BUG")))
    assert (r, terminated, truncated, info["status"]) == (0.0, False, False, "incorrect")
    assert info["eval"].status == "incorrect" and info["turn"] == 1
    assert [m["role"] for m in obs] == ["system", "user", "assistant", "user"]
    assert obs[-1]["content"] == info["feedback"] and info["feedback"].startswith("Turn 1 of 3")

    obs, r, terminated, truncated, info = env.step(reply(kernel(runtime_ms=0.5)))
    assert r == pytest.approx(1.0 + math.log(EAGER_MS / 0.5)) and info["best"].turn == 2
    obs, r, terminated, truncated, info = env.step("no code at all")
    assert (r, terminated, truncated, info["status"]) == (-0.5, False, True, "format_error")


def test_an_episode_terminates_when_solved_or_after_too_many_format_errors():
    env = make_env(agent=AgentConfig(stop_when_correct=True))
    env.reset(options={"problem": "L3/1"})
    assert env.step(reply(kernel()))[2] is True
    env = make_env(agent=AgentConfig(max_consecutive_format_errors=2), max_turns=5)
    env.reset(seed=3)
    assert [env.step("nothing")[2] for _ in range(2)] == [False, True]


def test_problems_are_drawn_with_the_seed_and_bad_use_is_a_clear_error():
    env = make_env()
    drawn = [env.reset(seed=s)[1]["problem_id"] for s in range(8)]
    assert drawn == [env.reset(seed=s)[1]["problem_id"] for s in range(8)] and len(set(drawn)) == 2
    with pytest.raises(KloopError, match="no problem 'L3/9' among L3/1, L3/2"):
        env.reset(options={"problem": "L3/9"})
    with pytest.raises(KloopError, match="call reset"):
        make_env().step("x")
    with pytest.raises(KloopError, match="summary context policy"):
        make_env(agent=AgentConfig(context="summary"))


def test_the_reward_is_configured_in_one_place():
    ev = FakeEvaluator()
    problem = PROBLEMS[0]
    fast = ev.evaluate(problem, kernel(runtime_ms=0.1))  # 20x: clipped at 10x by default
    assert reward(fast, RewardConfig()) == pytest.approx(1.0 + math.log(10.0))
    assert reward(fast, RewardConfig(speedup_weight=0.0)) == 1.0
    assert reward(fast, RewardConfig(baseline="compile")) == 1.0  # no compile speedup measured
    slow = ev.evaluate(problem, kernel(runtime_ms=4.0))
    assert reward(slow, RewardConfig()) == pytest.approx(1.0 + math.log(0.5))
    assert reward(ev.evaluate(problem, kernel("CHEAT")), RewardConfig()) == -1.0
    assert reward(ev.evaluate(problem, kernel("SYNTAX")), RewardConfig(compile_error=-0.2)) == -0.2
    assert reward(None, RewardConfig(format_error=-2)) == -2
    with pytest.raises(ValueError):
        RewardConfig(bonus=1)


def test_the_lower_end_of_a_speedup_interval_where_a_result_has_one():
    """Read from the evaluator's own record: `speedup_ci[baseline]`, and for `best` the
    interval of the baseline that is fastest (`best_baseline`)."""
    result = FakeEvaluator().evaluate(PROBLEMS[0], kernel(runtime_ms=1.0, ci=(1.5, 2.5)))
    assert (result.speedup_vs_eager, result.best_baseline) == (EAGER_MS, "eager")
    assert speedup_of(result, RewardConfig()) == EAGER_MS
    assert speedup_of(result, RewardConfig(interval="lower")) == 1.5  # best: eager's interval
    assert speedup_of(result, RewardConfig(interval="lower", baseline="eager")) == 1.5
    # The fastest baseline is compile: `best` takes compile's interval, not eager's.
    vs_compile = with_interval(result.model_copy(update={
        "speedup_vs_compile": 1.2, "speedup_vs_best": 1.2, "best_baseline": "compile"}),
        1.1, 1.3, baseline="compile")
    assert speedup_of(vs_compile, RewardConfig(interval="lower")) == 1.1
    assert speedup_of(vs_compile, RewardConfig(interval="lower", baseline="eager")) == 1.5
    # A result without an interval (no paired rounds): the point speedup.
    without = FakeEvaluator().evaluate(PROBLEMS[0], kernel(runtime_ms=1.0))
    assert without.speedup_ci == {}
    assert speedup_of(without, RewardConfig(interval="lower")) == EAGER_MS


def test_step_many_steps_each_env_with_its_own_kernel(tmp_path):
    evaluator = FakeEvaluator(delay_s=0.2)
    envs = [make_env(evaluator=evaluator) for _ in range(3)]
    for env, pid in zip(envs, ["L3/1", "L3/2", "L3/1"], strict=True):
        env.reset(options={"problem": pid})
    out = step_many(envs, [reply(kernel(runtime_ms=1.0)), "no code", reply(kernel("BUG"))], 3)
    assert [o[4]["status"] for o in out] == ["correct", "format_error", "incorrect"]
    assert [o[4]["eval"].problem_id if o[4]["eval"] else None for o in out] == ["L3/1", None, "L3/1"]
    assert len(evaluator.calls) == 2


def test_a_sink_makes_the_trajectories_a_run_directory(tmp_path):
    cfg = make_config()
    store = RunStore.create(tmp_path / "rl", cfg)
    env = make_env(sink=store)
    env.reset(options={"problem": "L3/1"})
    env.step(reply(kernel(runtime_ms=0.5)))
    [turn] = store.turns()
    assert turn.status == "correct" and (store.root / turn.kernel_path).read_text() == kernel(runtime_ms=0.5)


@pytest.mark.slow
def test_the_example_runs_a_scripted_policy_through_the_real_evaluator_on_cpu():
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "rl_scripted.py")], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.strip().splitlines()
    assert [line.split('"status": ')[1].split('"')[1] for line in lines[:4]] == [
        "compile_error", "incorrect", "correct", "correct"]
    assert '"reward": 1.0' in lines[2] and '"truncated": true' in lines[3]
    assert '"best_turn": 4' in lines[4]


@pytest.mark.slow
def test_step_many_judges_through_the_evaluators_one_queue_on_cpu(tmp_path):
    from kloop.agent.config import parse_layer, resolve
    from kloop.agent.models.scripted import ScriptedModel
    from kloop.agent.rl import make_env as env_of
    from kloop.agent.run import DEMO_DIR

    cfg = resolve([parse_layer(str(DEMO_DIR / "demo.yaml")),
                   {"model": {"spec": "scripted:policy"}, "eval": {"device": "cpu"}}])
    demo = ScriptedModel.from_file(DEMO_DIR / "replies.yaml")
    texts = [demo.query([]).text for _ in range(4)]
    envs = [env_of(cfg) for _ in range(2)]
    batches = []
    for env in envs:
        env.reset(options={"problem": "L3/1"})
        original = env.evaluator.batch
        env.evaluator.batch = lambda n, original=original: (batches.append(n), original(n))[1]
    out = step_many(envs, [texts[2], texts[3]], concurrency=2)
    assert [o[4]["status"] for o in out] == ["correct", "correct"] and batches == [2]
