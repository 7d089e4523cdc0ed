"""What a kernel's hardware counters suggest, in one line, for the feedback (prompts/_ncu.j2).

The rules below are tried in order and the first that applies gives the line: definite defects
first (spills, an idle GPU), then the roofline side the kernel sits on, then what caps its
occupancy, then the dominant warp stall, then latency. Each is a plain threshold on the numbers
of `NcuMetrics` so that the same record always gives the same line, and a missing number makes
a rule step aside rather than guess.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from kloop.evaluator.common.result import NcuMetrics

BOUND_PCT = 60.0
"""A unit this busy (% of peak) while the other is less busy says which one sets the time."""
NEAR_PEAK_PCT = 80.0
"""Past this, the busy unit is close to its roofline: only less work on it helps."""
LOW_OCCUPANCY_PCT = 50.0
"""Theoretical occupancy below this leaves too few warps to hide memory latency."""
DOMINANT_STALL_SHARE = 0.4
"""A stall reason holding this share of the stall cycles is what the warps mostly wait for."""
IDLE_PCT = 30.0
"""Neither memory nor compute past this: the kernel waits rather than works."""
SHORT_LAUNCH_US = 5.0
"""A launch this short is in the range of launch overhead (a few microseconds)."""


class StallShare(NamedTuple):
    reason: str
    ratio: float
    """Warps stalled for this reason per issued instruction."""
    share: float
    """Its share of the stall cycles of all reasons collected."""


def top_stalls(m: NcuMetrics, n: int = 3) -> list[StallShare]:
    """The `n` stall reasons with the most stall cycles (zero ones left out), most first."""
    total = sum(m.stalls.values())
    if total <= 0:
        return []
    ranked = sorted(m.stalls.items(), key=lambda kv: (-kv[1], kv[0]))
    return [StallShare(r, v, v / total) for r, v in ranked[:n] if v > 0]


def stalls_text(m: NcuMetrics, n: int = 3) -> str:
    """`long_scoreboard 62%, barrier 20%` (or `-` where ncu gave no stalls)."""
    return ", ".join(f"{s.reason} {s.share:.0%}" for s in top_stalls(m, n)) or "-"


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x:.0f}%"


# Rationale: local-memory stores are registers that did not fit; each is a round trip to memory.
def _spills(m: NcuMetrics) -> str | None:
    if not m.spill_bytes:
        return None
    return (f"registers spill to local memory ({m.spill_bytes} bytes stored per launch): keep "
            "fewer values live per thread (smaller tiles, less unrolling)")


# Rationale: a block runs on one SM, so fewer blocks than SMs leaves whole SMs idle.
def _too_few_blocks(m: NcuMetrics) -> str | None:
    if m.grid_size is None or m.sm_count is None or m.grid_size >= m.sm_count:
        return None
    return (f"only {m.grid_size} blocks for {m.sm_count} SMs, so {m.sm_count - m.grid_size} SMs "
            "sit idle: split the work into more blocks (smaller tiles, or split the reduction)")


# Rationale: DRAM busier than the SMs and near its peak: bytes moved, not math, set the time.
def _memory_bound(m: NcuMetrics) -> str | None:
    dram, sm = m.dram_throughput_pct, m.sm_throughput_pct
    if dram is None or dram < BOUND_PCT or (sm is not None and sm > dram):
        return None
    if dram >= NEAR_PEAK_PCT:
        return (f"memory-bound at {_pct(dram)} of DRAM peak: only moving fewer bytes helps "
                "(fuse with neighbouring ops, reuse loaded data, narrower types)")
    return (f"memory-bound (DRAM {_pct(dram)}, SM {_pct(sm)}): cut global memory traffic "
            "(fusion, reuse through shared memory or registers, coalesced wide loads)")


# Rationale: the SMs busier than DRAM and near their peak: instructions set the time.
def _compute_bound(m: NcuMetrics) -> str | None:
    dram, sm = m.dram_throughput_pct, m.sm_throughput_pct
    if sm is None or sm < BOUND_PCT or (dram is not None and dram > sm):
        return None
    return (f"compute-bound (SM {_pct(sm)}, DRAM {_pct(dram)}): fewer or cheaper instructions "
            "(tensor cores for matmul-like loops via tl.dot or mma, less index arithmetic)")


# Rationale: the smallest per-resource block limit is what caps the warps an SM can hold.
def _occupancy_cap(m: NcuMetrics) -> str | None:
    theo = m.theoretical_occupancy_pct
    if theo is None or theo >= LOW_OCCUPANCY_PCT:
        return None
    limits = {"registers": m.blocks_limit_registers, "shared memory": m.blocks_limit_shared_mem,
              "block size": m.blocks_limit_warps}
    known = {k: v for k, v in limits.items() if v is not None}
    if not known:
        return None
    low = min(known.values())
    binding = [k for k, v in known.items() if v == low]
    if binding == ["registers"]:
        return (f"registers ({m.registers_per_thread}/thread) cap occupancy at {_pct(theo)}: "
                "keep fewer values live per thread, or use smaller blocks")
    if binding == ["shared memory"]:
        kb = (m.shared_bytes or 0) / 1024
        return (f"shared memory ({kb:.0f} KB/block) caps occupancy at {_pct(theo)}: smaller "
                "tiles or fewer pipeline stages")
    return None


_STALL_ADVICE = {
    "long_scoreboard": "warps wait on global or local memory loads; keep more loads in flight "
                       "(software pipelining, num_stages, more independent work per thread) or "
                       "reuse data already loaded",
    "barrier": "warps wait at barriers (__syncthreads); synchronise less often or even out the "
               "work of a block's warps",
    "short_scoreboard": "warps wait on shared memory or special math units; avoid bank "
                        "conflicts and shared-memory round trips",
    "mio_throttle": "the shared-memory and special-function queue is full; fewer, wider shared "
                    "accesses without bank conflicts",
    "math_pipe_throttle": "a math pipe is saturated; move matmul work to tensor cores or mix "
                          "instruction types",
    "lg_throttle": "the global load/store queue is full; fewer, wider (vectorised) accesses",
    "wait": "fixed-latency dependencies; more independent instructions between dependent ones "
            "(unrolling, several outputs per thread)",
    "membar": "memory fences; drop fences and ordered atomics the algorithm does not need",
    "branch_resolving": "warps wait for branches to resolve; less divergent control flow",
    "no_instruction": "instruction fetch misses; the code is too large or jumps around (less "
                      "unrolling or inlining)",
    "imc_miss": "constant-cache misses; fewer distinct constants per instruction",
}


# Rationale: a reason holding most stall cycles names what the warps wait for.
def _dominant_stall(m: NcuMetrics) -> str | None:
    top = top_stalls(m, 1)
    if not top or top[0].share < DOMINANT_STALL_SHARE:
        return None
    s = top[0]
    head = f"top stall {s.reason} ({s.share:.0%} of stall cycles)"
    advice = _STALL_ADVICE.get(s.reason)
    return head if advice is None else f"{head}: {advice}"


# Rationale: with both units idle the time is latency: launch overhead or too little parallelism.
def _latency_bound(m: NcuMetrics) -> str | None:
    dram, sm = m.dram_throughput_pct, m.sm_throughput_pct
    if dram is None or sm is None or dram >= IDLE_PCT or sm >= IDLE_PCT:
        return None
    if m.duration_us is not None and m.duration_us < SHORT_LAUNCH_US:
        return (f"a {m.duration_us:.1f} us launch with memory and compute mostly idle: launch "
                "overhead dominates; fuse it with neighbouring kernels")
    return (f"latency-bound (SM {_pct(sm)}, DRAM {_pct(dram)}): expose more parallelism (more "
            "blocks, more independent work per thread)")


RULES: list[Callable[[NcuMetrics], str | None]] = [
    _spills, _too_few_blocks, _memory_bound, _compute_bound, _occupancy_cap, _dominant_stall,
    _latency_bound,
]


def hint(m: NcuMetrics) -> str:
    """One line on what the counters of `m` suggest: the first rule of `RULES` that applies."""
    for rule in RULES:
        line = rule(m)
        if line is not None:
            return line
    return (f"no single limiter stands out (SM {_pct(m.sm_throughput_pct)}, "
            f"DRAM {_pct(m.dram_throughput_pct)})")
