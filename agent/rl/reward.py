"""The reward of one turn, in one place: what a kernel earns from its verdict and its speedup.

    correct kernel:  correct + speedup_weight * clip(log(speedup), -log_clip, log_clip)
    anything else:   the penalty of its status (`rejected`, `format_error`, ...)

`speedup` is the kernel's speedup against `baseline`. Where the verdict carries an interval
for it (`EvalResult.speedup_ci`, read only where the evaluator provides one) `interval: lower`
uses its lower end, so a speedup inside the timing noise earns nothing. Where no speedup was
measured (a CPU timing, a run without baselines) the log term is 0: correctness alone.
"""

from __future__ import annotations

import math
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from kloop.evaluator.common.result import EvalResult


class RewardConfig(BaseModel):
    """How a turn is rewarded; every field documented, the defaults a reasonable start."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)

    correct: float = 1.0
    """Reward of a kernel that matches the reference."""
    speedup_weight: float = 1.0
    """Weight of log(speedup) for a correct kernel (0: correctness alone)."""
    baseline: Literal["eager", "compile", "best"] = "best"
    """Which speedup: against PyTorch eager, torch.compile, or the fastest baseline measured."""
    interval: Literal["point", "lower"] = "point"
    """`point`: the measured speedup; `lower`: the lower end of its interval where the result
    has one (else the point)."""
    log_clip: float = Field(math.log(10.0), gt=0)
    """|log(speedup)| is clipped here, so one outlier timing cannot dominate a batch."""
    incorrect: float = 0.0
    """A kernel that ran but gave wrong outputs."""
    compile_error: float = 0.0
    runtime_error: float = 0.0
    timeout: float = 0.0
    not_run: float = 0.0
    """A kernel that cannot run here (CUDA code without a GPU) after its compile check."""
    rejected: float = -1.0
    """A kernel that broke a rule of the policy (the anti-cheat checks): below any honest failure."""
    format_error: float = -0.5
    """A reply with no usable code block."""


def speedup_of(result: EvalResult, cfg: RewardConfig) -> float | None:
    """The speedup the reward uses (see `RewardConfig.baseline` and `interval`), or None."""
    point = {"eager": result.speedup_vs_eager, "compile": result.speedup_vs_compile,
             "best": result.speedup_vs_best}[cfg.baseline]
    if point is None or cfg.interval == "point":
        return point
    low = _lower_end(result, cfg.baseline)
    return point if low is None else low


def _lower_end(result: EvalResult, baseline: Literal["eager", "compile", "best"]) -> float | None:
    """The lower end of the speedup's interval over the paired rounds (`EvalResult.speedup_ci`),
    None where it has none. `best` is the speedup against the fastest baseline, whose interval
    is that baseline's (`EvalResult.best_baseline`)."""
    name = result.best_baseline if baseline == "best" else baseline
    ci = result.speedup_ci.get(name) if name is not None else None
    return ci.low if ci is not None else None


def reward(result: EvalResult | None, cfg: RewardConfig) -> float:
    """The reward of a turn whose verdict is `result` (None: the reply had no usable code)."""
    if result is None:
        return cfg.format_error
    if not result.correct:
        return getattr(cfg, result.status)
    speedup = speedup_of(result, cfg)
    if speedup is None or speedup <= 0:
        return cfg.correct
    log = max(-cfg.log_clip, min(cfg.log_clip, math.log(speedup)))
    return cfg.correct + cfg.speedup_weight * log
