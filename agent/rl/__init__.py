"""RL training on kernel writing: `KernelEnv`, a gymnasium environment over the turn loop
(agent/rl/env.py, `pip install -e ".[rl]"` in a kloop clone), and the reward it pays
(agent/rl/reward.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from kloop.agent.rl.reward import RewardConfig

if TYPE_CHECKING:
    from pathlib import Path

    from kloop.agent.config import RunConfig
    from kloop.agent.rl.env import KernelEnv

__all__ = ["RewardConfig", "make_env"]


def make_env(cfg: RunConfig, reward_config: RewardConfig | None = None,
             run_dir: Path | None = None) -> KernelEnv:
    """A KernelEnv over a run config's problems, evaluator (its `eval` and `executor`, size
    overrides included), agent settings and `strategy.turns`; with `run_dir`, every step is
    written to a new run directory there."""
    from kloop.agent.components import build_evaluator, load_problems
    from kloop.agent.rl.env import KernelEnv
    from kloop.agent.store import RunStore

    problems = load_problems(cfg)
    evaluator = build_evaluator(cfg, problems)
    sink = RunStore.create(run_dir, cfg) if run_dir is not None else None
    return KernelEnv(evaluator, problems, reward_config=reward_config, agent=cfg.agent,
                     max_turns=cfg.strategy.turns, comparison=cfg.eval.comparison(), sink=sink)
