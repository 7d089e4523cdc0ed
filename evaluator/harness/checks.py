"""Policy and anti-cheat checks, as lists the pipeline runs. Every rule's name, rationale and
severity per policy is in the one table of `evaluator.common.rules` (`RUNTIME_RULES` is its runtime
part); this module holds the runtime checks and the adapter to the static ones.

- `STATIC_CHECKS`: on the source in the harness before anything executes (`evaluator.harness.static`).
- `TRIAL_CHECKS`: on what the candidate child reported for one trial, after its outputs were
  judged. `check(run, ledger, trial_msg) -> list[Violation]`.
- `PROBE_CHECKS`: on what a probe in the candidate process saw (`evaluator.worker.probes`, reported as
  `ProbeMsg`). `check(run, ledger, probe_msg) -> list[Violation]`.
- `determinism`: on the two outputs of the repeated trial, in the harness.
- `RESULT_CHECKS`: on the finished run (speedups, problem facts). They only flag.

A check reads the verdict so far and adds findings through the stage's `Ledger`
(`evaluator.harness.ledger`); the violations it returns are recorded by its caller.

A violation with severity `reject` makes the status `rejected`; `flag` only records it. Every
rule that fires also puts its name in the result's flags, once.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch

from kloop.evaluator.common.correctness import CHUNK, compare_outputs
from kloop.evaluator.common.protocol import ProbeMsg, TrialMsg
from kloop.evaluator.common.result import Backend, Violation
from kloop.evaluator.common.rules import Rule, Severity, of_kind
from kloop.evaluator.harness.outcome import Flagged, violated

if TYPE_CHECKING:
    from kloop.evaluator.harness.ledger import Ledger
    from kloop.evaluator.harness.state import EvalRun

__all__ = ["RUNTIME_RULES", "STATIC_CHECKS", "Severity", "probe_violations",
           "trial_violations", "violate"]

StaticCheck = Callable[[str, Backend, str], list[Violation]]
TrialCheck = Callable[["EvalRun", "Ledger", TrialMsg], list[Violation]]
ProbeCheck = Callable[["EvalRun", "Ledger", ProbeMsg], list[Violation]]
ResultCheck = Callable[["EvalRun", "Ledger"], None]


def ast_rules(source: str, backend: Backend, policy: str) -> list[Violation]:
    """The AST rules of evaluator.harness.static (introspection, timer patching, threads, caches...)."""
    from kloop.evaluator.harness.static import static_violations

    return static_violations(source, policy)


STATIC_CHECKS: list[StaticCheck] = [ast_rules]


RuntimeRule = Rule
RUNTIME_RULES: dict[str, Rule] = of_kind("runtime")
"""The runtime rules of the table in `evaluator.common.rules` (name, rationale, severities)."""


def violate(run: EvalRun, rule: str, message: str, severity: Severity | None = None) -> Violation:
    """A violation of a runtime rule with the run's policy severity (once recorded, its name
    joins the flags: `evaluator.harness.outcome.fold`)."""
    r = RUNTIME_RULES[rule]
    return Violation(rule=rule, severity=severity or r.severity(run.policy.name),
                     message=f"{message}: {r.rationale}")


def _fired(ledger: Ledger, rule: str) -> bool:
    return any(v.rule == rule for v in ledger.verdict.violations)


# ---- per trial -----------------------------------------------------------------------------


# Rationale: see RUNTIME_RULES["input_mutation"].
def input_mutation(run: EvalRun, ledger: Ledger, msg: TrialMsg) -> list[Violation]:
    if not msg.mutated_inputs or _fired(ledger, "input_mutation"):
        return []
    return [violate(run, "input_mutation", f"forward wrote into its input tensor(s) "
                    f"{msg.mutated_inputs} (trial {msg.index})")]


# Rationale: catalog T1/T4, see RUNTIME_RULES["deferred_work"].
def deferred_work(run: EvalRun, ledger: Ledger, msg: TrialMsg) -> list[Violation]:
    if not msg.deferred or _fired(ledger, "deferred_work"):
        return []
    return [violate(run, "deferred_work", f"the output of trial {msg.index} changed between "
                    "the return of forward and a full device synchronize")]


# Rationale: catalog T2. Libraries may start their worker threads in the very first call, so
# the first trial's count is not held against the candidate.
def background_threads(run: EvalRun, ledger: Ledger, msg: TrialMsg) -> list[Violation]:
    if msg.threads_grew <= 0 or msg.index == 0 or _fired(ledger, "background_threads"):
        return []
    return [violate(run, "background_threads", f"{msg.threads_grew} thread(s) started during "
                    f"forward were still running when it returned (trial {msg.index})")]


TRIAL_CHECKS: list[TrialCheck] = [input_mutation, deferred_work, background_threads]


def trial_violations(run: EvalRun, ledger: Ledger, msg: TrialMsg) -> list[Violation]:
    return [v for check in TRIAL_CHECKS for v in check(run, ledger, msg)]


# ---- probes in the candidate process -------------------------------------------------------


# Rationale: catalog T3, C11 — kloop's timer and its own functions were bound before the
# candidate was imported; any of them replaced means its timings cannot be trusted.
def identity(run: EvalRun, ledger: Ledger, msg: ProbeMsg) -> list[Violation]:
    if msg.probe != "identity" or not msg.names or _fired(ledger, "timer_tampering"):
        return []
    return [violate(run, "timer_tampering", f"replaced {', '.join(msg.names[:8])} ({msg.detail})")]


# Rationale: catalog T5, see RUNTIME_RULES["l2_persistence"].
def l2_persistence(run: EvalRun, ledger: Ledger, msg: ProbeMsg) -> list[Violation]:
    if msg.probe != "l2_persistence" or not msg.names or _fired(ledger, "l2_persistence"):
        return []
    return [violate(run, "l2_persistence", f"{msg.names[0]} ({msg.detail})")]


# Rationale: catalog B6, C8 — flags set by the candidate at import or in forward.
def backend_flags(run: EvalRun, ledger: Ledger, msg: ProbeMsg) -> list[Violation]:
    if msg.probe != "backend_flags" or not msg.names or _fired(ledger, "backend_flags_changed"):
        return []
    return [violate(run, "backend_flags_changed", f"{'; '.join(msg.names)} ({msg.detail})")]


# Rationale: catalog T2 — Python threads alive that were not there before the candidate ran.
def python_threads(run: EvalRun, ledger: Ledger, msg: ProbeMsg) -> list[Violation]:
    if msg.probe != "threads" or not msg.value or msg.value <= 0 or \
            _fired(ledger, "background_threads"):
        return []
    return [violate(run, "background_threads", f"{int(msg.value)} Python thread(s) the "
                    f"candidate started are alive {msg.detail}")]


# Rationale: catalog B5 — a kernel backend whose kernels never launched during a forward.
def launches(run: EvalRun, ledger: Ledger, msg: ProbeMsg) -> list[Violation]:
    if msg.probe != "launches":
        return []
    if not msg.conclusive:
        ledger.record(Flagged(flag="launch_count_unavailable"))
        return []
    if msg.value or _fired(ledger, "no_custom_kernel"):
        return []
    return [violate(run, "no_custom_kernel", f"none of the candidate's {ledger.verdict.backend} kernels "
                    "launched during a forward")]


# Rationale: catalog B5 — kernels that run but do not matter: the output is the same when
# every one of them is replaced by a no-op.
def ghost(run: EvalRun, ledger: Ledger, msg: ProbeMsg) -> list[Violation]:
    if msg.probe != "ghost":
        return []
    if not msg.conclusive:
        # Why, after the name: a stub that missed a launch reads differently from a
        # degenerate problem, and the user deciding what the flag means needs to know which.
        ledger.record(Flagged(flag=f"ghost_check_inconclusive: {msg.detail[:160]}"))
        return []
    if not msg.value or _fired(ledger, "no_custom_kernel"):
        return []
    return [violate(run, "no_custom_kernel", f"ghost kernels: {msg.detail}")]


PROBE_CHECKS: list[ProbeCheck] = [identity, backend_flags, python_threads, launches, ghost,
                                  l2_persistence]


def probe_violations(run: EvalRun, ledger: Ledger, msg: ProbeMsg) -> list[Violation]:
    return [v for check in PROBE_CHECKS for v in check(run, ledger, msg)]


# ---- determinism (harness) -----------------------------------------------------------------


def _bitwise_equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    """Equal element by element (NaN equal to NaN), chunk by chunk (`correctness.CHUNK`)."""
    for x, y in zip(a, b, strict=True):
        if x.shape != y.shape or x.dtype != y.dtype:
            return False
        if torch.equal(x, y):  # one comparing pass: equal unless NaNs are to be matched
            continue
        xf, yf = x.reshape(-1), y.reshape(-1)
        for at in range(0, xf.numel(), CHUNK):
            p, q = xf[at:at + CHUNK], yf[at:at + CHUNK]
            eq = p == q
            if p.is_floating_point():
                eq |= p.isnan() & q.isnan()
            if not bool(eq.all()):
                return False
    return True


def determinism(run: EvalRun, first: list, second: list, tol: float) -> list[Violation]:
    """The repeated call's outputs against the first call's: beyond the tolerance rejects (under
    strict), within it but not bitwise equal (atomics, split reductions) only flags."""
    if not all(isinstance(x, torch.Tensor) for x in [*first, *second]) or not first:
        return []
    diffs = compare_outputs(first, second, ["torch.Tensor"] * len(second), tol)
    if not all(d.ok for d in diffs):
        bad = next(d for d in diffs if not d.ok)
        return [violate(run, "nondeterministic", f"a second call on the same inputs differs "
                        f"beyond the tolerance: {bad.message}")]
    if len(first) != len(second) or not _bitwise_equal(first, second):
        return [violate(run, "nondeterministic", "a second call on the same inputs differs in "
                        "the last bits (within the tolerance)", severity="flag")]
    return []


# ---- the finished run ----------------------------------------------------------------------


def is_degenerate(run: EvalRun) -> bool:
    """The problem's output does not depend on its input at this run's tolerance."""
    at = run.problem.meta.degenerate_at
    return at is not None and at <= run.policy.tolerance(run.config.precision) * (1 + 1e-9)


# Rationale: catalog C5 — reports must be able to leave these problems out; where the problem
# has no trial that makes a constant output fail, say so too.
def degenerate_problem(run: EvalRun, ledger: Ledger) -> None:
    if not is_degenerate(run):
        return
    ledger.record(Flagged(flag="degenerate_problem"))
    probe = run.problem.meta.degenerate_probe
    if probe is None or not run.policy.degenerate_trials:
        ledger.record(Flagged(flag="degenerate_no_probe"))


def prefix_probed(run: EvalRun) -> bool:
    """The problem forgets the start of its sequence at this run's tolerance, and this run draws
    its inputs from the distribution under which the whole sequence matters (measured at
    `prefix.tol`; a looser tolerance is not covered by that measurement)."""
    prefix = run.problem.meta.prefix
    return (prefix is not None and prefix.insensitive and run.policy.whole_input_trials
            and prefix.strict_input_scale is not None
            and run.policy.tolerance(run.config.precision) <= prefix.tol * (1 + 1e-9))


# Rationale: a recurrence that forgets its start can be computed from its last steps alone
# (L3/36: the last 32 of 512 LSTM steps); where this run's inputs do not close that, say so.
def prefix_unprobed(run: EvalRun, ledger: Ledger) -> None:
    prefix = run.problem.meta.prefix
    if prefix is not None and prefix.insensitive and not prefix_probed(run):
        ledger.record(Flagged(flag="prefix_unprobed"))


# Rationale: catalog B1 — plain PyTorch is honest but has no kernel of the candidate's; it is
# judged on its outputs and flagged (only pretending to have kernels is rejected).
def torch_only(run: EvalRun, ledger: Ledger) -> None:
    if ledger.verdict.backend == "torch":
        ledger.record(Flagged(flag="no_custom_kernel"))


def implausible_speedup(run: EvalRun, ledger: Ledger) -> None:
    from kloop.evaluator.harness.state import run_speedup

    v = ledger.verdict
    speedup = run_speedup(run.policy, v, v.eager)
    if speedup is not None and speedup > run.policy.excessive_speedup:
        ledger.record(*violated(violate(run, "implausible_speedup", f"{speedup:.1f}x over eager "
                                       f"(bound {run.policy.excessive_speedup:g}x)")))


_THROTTLED = {"sw_power_cap", "hw_slowdown", "sw_thermal", "hw_thermal", "hw_power_brake"}
CLOCK_SPREAD = 0.05
"""How far (relative) the SM clock around a candidate's timing may be from the clock around its
eager baseline's before the speedup is flagged as measured on two different devices' worth."""


# Rationale: users' complaint about timing noise (clocks, throttling): a speedup is a ratio of
# two timings, and both should be taken on the same clock. Flags only: the numbers stand, the
# reader is told they rest on a throttled or re-clocked device.
def gpu_conditions(run: EvalRun, ledger: Ledger) -> None:
    t, e = ledger.verdict.timing, ledger.verdict.eager
    if t is None:
        return
    mine = [s for s in (t.gpu_before, t.gpu_after) if s is not None]
    if any(_THROTTLED & set(s.clock_limits or ()) for s in mine):
        ledger.record(Flagged(flag="gpu_throttled"))
    theirs = [s for s in (e.gpu_before, e.gpu_after) if s is not None] if e else []
    a = [s.sm_clock_mhz for s in mine if s.sm_clock_mhz]
    b = [s.sm_clock_mhz for s in theirs if s.sm_clock_mhz]
    if a and b and abs(statistics.median(a) / statistics.median(b) - 1) > CLOCK_SPREAD:
        ledger.record(Flagged(flag="gpu_clock_differs"))


RESULT_CHECKS: list[ResultCheck] = [degenerate_problem, prefix_unprobed, torch_only,
                                    implausible_speedup, gpu_conditions]


def result_checks(run: EvalRun, ledger: Ledger) -> None:
    for check in RESULT_CHECKS:
        check(run, ledger)
