"""Which baseline a candidate is judged against when several were measured.

KernelBench v3 scores against the faster of eager and compiled; kloop keeps every speedup and
adds the one against the fastest baseline, so that a report can show fast_p against each of
them and against the hardest. "Fastest" is read from the speedups themselves (each on the clock
its pair was divided on, `evaluator.harness.state.speedup`): the fastest baseline is the one the
candidate beats by the least, so `speedup_vs_best` is never above any single speedup.
"""

from __future__ import annotations

from typing import NamedTuple

from kloop.evaluator.common.result import BaselineName

ORDER: tuple[BaselineName, ...] = ("eager", "compile", "compile_ro")
"""Also the order that breaks ties: of two baselines exactly as fast, the simpler one is named."""


class BestBaseline(NamedTuple):
    name: BaselineName | None
    speedup: float | None


def best_of(speedups: dict[BaselineName, float | None]) -> BestBaseline:
    """The smallest of the speedups that exist, and whose it is; (None, None) without any."""
    known = [(speedups[n], i, n) for i, n in enumerate(ORDER) if speedups.get(n) is not None]
    if not known:
        return BestBaseline(None, None)
    speedup, _, name = min(known)
    return BestBaseline(name, speedup)
