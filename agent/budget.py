"""The budget meter: what an episode and a run have spent, in matched units, against limits.

Units: LLM calls, input/output/reasoning tokens, dollars, evaluation seconds, GPU-seconds (the
device's exclusive holds) and wall-clock seconds. Limits are checked before each model call, so
the call that crosses a limit completes and is counted; the next one is not made.
"""

from __future__ import annotations

import threading
import time

from pydantic import BaseModel, ConfigDict

from kloop.agent.config import Limits
from kloop.agent.models.base import ModelReply


class Spend(BaseModel):
    """Totals in matched units (also the per-turn and per-episode cost on disk)."""

    model_config = ConfigDict(extra="forbid")

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cached_tokens: int = 0
    cost_usd: float = 0.0
    unpriced_calls: int = 0
    """Calls whose cost is unknown (no price for the model): `cost_usd` leaves them out."""
    unmetered_calls: int = 0
    """Calls whose token usage is unknown (imported kernels): the token counts leave them out."""
    eval_s: float = 0.0
    """Wall seconds of the evaluator calls (builds, process starts and waits for the device
    included: more of them where more evaluations run at once)."""
    gpu_s: float = 0.0
    """Seconds the evaluations held the device (`EvalResult.held_s`, a reference worker's
    shared hold counted whole): GPU-seconds on a GPU."""
    wall_s: float = 0.0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Spend) -> Spend:
        return Spend(**{k: getattr(self, k) + getattr(other, k) for k in Spend.model_fields})

    def __sub__(self, other: Spend) -> Spend:
        """What is left once `other`, a part of this total, is accounted for elsewhere."""
        return Spend(**{k: getattr(self, k) - getattr(other, k) for k in Spend.model_fields})

    @classmethod
    def of_reply(cls, reply: ModelReply) -> Spend:
        u = reply.usage
        tokens = {} if u is None else dict(
            input_tokens=u.input_tokens, output_tokens=u.output_tokens,
            reasoning_tokens=u.reasoning_tokens, cached_tokens=u.cached_tokens)
        return cls(
            calls=1, **tokens,
            cost_usd=reply.cost_usd or 0.0,
            unpriced_calls=int(reply.cost_usd is None),
            unmetered_calls=int(u is None),
        )


_UNITS = {"cost_usd": "USD", "eval_s": "s", "gpu_s": "s", "wall_s": "s"}


class Meter:
    """Thread-safe running totals; an episode meter also charges its run meter."""

    def __init__(self, limits: Limits, scope: str, parent: Meter | None = None,
                 spent: Spend | None = None):
        self.limits = limits
        self.scope = scope
        self.parent = parent
        self._spent = spent or Spend()
        """Everything but the wall clock of this session; `spent` adds it."""
        self._started = time.monotonic()
        self._lock = threading.Lock()

    def charge(self, spend: Spend) -> None:
        """Add a turn's spend (its `wall_s` is ignored: the meter keeps its own clock)."""
        with self._lock:
            self._spent = self._spent + spend.model_copy(update={"wall_s": 0.0})
        if self.parent is not None:
            self.parent.charge(spend)

    def spent(self) -> Spend:
        with self._lock:
            elapsed = time.monotonic() - self._started
            return self._spent.model_copy(update={"wall_s": self._spent.wall_s + elapsed})

    def exceeded(self) -> str | None:
        """The first limit reached, said in words (this meter first, then the run's); else None."""
        spent = self.spent()
        for name in Limits.model_fields:
            limit = getattr(self.limits, name)
            if limit is None:
                continue
            if name == "cost_usd" and spent.unpriced_calls:
                return (f"{self.scope} cost_usd limit cannot be enforced: {spent.unpriced_calls} "
                        "call(s) of unknown cost (add the model to the price table)")
            if name.endswith("tokens") and spent.unmetered_calls:
                return (f"{self.scope} {name} limit cannot be enforced: {spent.unmetered_calls} "
                        "call(s) of unknown token usage")
            used = getattr(spent, name)
            if used >= limit:
                unit = _UNITS.get(name, "")
                return f"{self.scope} {name} limit reached: {used:g} >= {limit:g} {unit}".rstrip()
        return self.parent.exceeded() if self.parent is not None else None
