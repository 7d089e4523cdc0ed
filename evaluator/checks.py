"""Policy and anti-cheat rules, as lists the pipeline runs. The anti-cheat issue adds to them.

- `STATIC_CHECKS`: run on the source in the harness before anything executes.
  `check(source, backend, policy_name) -> list[Violation]`.
- `TRIAL_CHECKS`: run in the harness on what the candidate child reported for one trial
  (after its outputs were judged). `check(run, trial_msg) -> list[Violation]`.
- Probes inside the candidate process (like the input-mutation comparison) live in
  `evaluator.candidate` and report through `TrialMsg` fields; the rule deciding what they mean
  lives here.

A violation with severity `reject` makes the status `rejected`; `flag` only records it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from evaluator.protocol import TrialMsg
from evaluator.result import Backend, Violation

if TYPE_CHECKING:
    from evaluator.state import EvalRun

StaticCheck = Callable[[str, Backend, str], list[Violation]]
TrialCheck = Callable[["EvalRun", TrialMsg], list[Violation]]


def ast_rules(source: str, backend: Backend, policy: str) -> list[Violation]:
    """The AST rules of evaluator.static (introspection, timer patching, threads, caches...)."""
    from evaluator.static import static_violations

    return static_violations(source, policy)


STATIC_CHECKS: list[StaticCheck] = [ast_rules]


# Rationale: a forward that writes into its inputs corrupts whatever reuses them (the timing
# loop's rotated input sets, the caller's tensors); KernelBench passes uncloned inputs.
def input_mutation(run: EvalRun, msg: TrialMsg) -> list[Violation]:
    if not msg.mutated_inputs or any(v.rule == "input_mutation" for v in run.violations):
        return []
    run.flags.append("input_mutation")
    return [Violation(
        rule="input_mutation", severity=run.policy.input_mutation,
        message=f"forward wrote into its input tensor(s) {msg.mutated_inputs} "
        f"(trial {msg.index})",
    )]


TRIAL_CHECKS: list[TrialCheck] = [input_mutation]


def trial_violations(run: EvalRun, msg: TrialMsg) -> list[Violation]:
    return [v for check in TRIAL_CHECKS for v in check(run, msg)]
