"""The one anti-cheat rule table: every static and runtime rule, its rationale and its severity
under each policy. `docs/anti-cheat.md` is generated from it (`scripts/make_anticheat_doc.py`),
so "what does strict reject, and why" has one answer.

A rule stays `reject` under `strict` only where nothing observed at run time can decide the
case; where a runtime check sees the effect (a wrong output on a fresh input, a clock the
candidate cannot reach), the rule only flags and the runtime evidence decides. `kernelbench`
reproduces KernelBench's verdicts, which reject none of these, so it flags everything except a
forged result channel (nothing such a run reports can be used).

The checks themselves live next to what they read: static rules in `evaluator.harness.static`, runtime
rules in `evaluator.harness.checks` (probes, trials, the finished run).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["reject", "flag"]
RuleKind = Literal["static", "runtime"]
DecidedIn = Literal["source", "candidate", "harness"]
"""Where a rule's evidence comes from: the candidate's source (names reached by computed strings
escape it), the candidate's own process (probes a native-code candidate can blind), or the
harness (its own comparisons and clock, which nothing in the candidate's process moves)."""
POLICY_NAMES = ("strict", "kernelbench")


@dataclass(frozen=True)
class Rule:
    name: str
    kind: RuleKind
    rationale: str
    strict: Severity = "reject"
    kernelbench: Severity = "flag"
    decided_in: DecidedIn = "candidate"

    @property
    def evidence_only(self) -> bool:
        """Decided from what the candidate wrote or reported, not by the harness itself."""
        return self.decided_in != "harness"

    def severity(self, policy: str) -> Severity:
        """Severity under `policy`; a policy not in the table is judged like `strict`."""
        return self.kernelbench if policy == "kernelbench" else self.strict


def _static(name: str, rationale: str, strict: Severity = "reject") -> Rule:
    return Rule(name, "static", rationale, strict, decided_in="source")


def _runtime(name: str, rationale: str, strict: Severity = "reject",
             kernelbench: Severity = "flag", decided_in: DecidedIn = "candidate") -> Rule:
    return Rule(name, "runtime", rationale, strict, kernelbench, decided_in)


_TABLE = (
    # ---- static: the candidate's syntax tree, before anything runs -------------------------
    _static("frame_introspection",
            "Reading frames, globals or the object graph lets a candidate find the harness's "
            "reference outputs or verdict channel (catalog C10, C11); nothing at run time shows "
            "that a read happened, so it stays a rejection. `gc.collect()` (and the other gc "
            "names that read no object) and the candidate's own namespace used as a registry "
            "(`globals()[name]`, `name in globals()`, its dict methods; no literal dunder key) "
            "pass. Evidence only: names reached by computed strings (getattr, a computed key to "
            "`__builtins__` and its eval, C10c) escape it; what decides is isolation, the "
            "expected output never existing in the candidate's process."),
    _static("timing_or_comparison_tampering",
            "Reassigning or wrapping torch/time/triton functions (Event, synchronize, "
            "perf_counter, allclose, testing…) can fake timings or comparisons (catalog T3). "
            "Since the clock of record runs in a trusted process, a patched "
            "timer no longer changes the recorded numbers; still rejected, because the same "
            "patch blinds the in-process probes (launch counts, ghost replay, flag snapshots) "
            "that no trusted check replaces."),
    _static("threads_or_processes",
            "A thread or process can compute outside the call: under the trusted-clock protocol "
            "it can watch fresh inputs land in shared memory and start before the clock does, "
            "or finish after the call returns (catalog T2); neither the clock nor an output "
            "check tells that from a fast kernel, and a process can outlive the evaluation. "
            "Lock, RLock, Semaphore, Event, Condition and thread-local state start nothing and "
            "pass; anything reached through them (`threading.Lock.__self__` is `_thread`) does "
            "not. Threads reached through another module (`queue.threading`) are invisible "
            "here and left to `background_threads`."),
    _static("tensor_subclass",
            "A Tensor subclass or a torch function/dispatch mode can defer or fake the "
            "computation until the output is compared (catalog C12), inside the comparison "
            "itself; no output check can be trusted to see through it."),
    _static("reference_model",
            "Subclassing or calling the reference `Model` returns PyTorch's own result with no "
            "kernel of the candidate's (catalog B1, B3); importing `evaluator` or `problems` "
            "reaches the harness's probes and the reference from inside the candidate, which "
            "nothing at run time observes."),
    _static("identity_keyed_cache",
            "A persistent table keyed by tensor identity or raw data pointer that stores "
            "something other than scalars can memoise outputs (catalog C4). Flag only: every "
            "checked call (every timed call, on fresh secret inputs) returns a stale "
            "output as a wrong one. `data_ptr() % 16` (alignment) is not identity, and tables "
            "whose stored values are provably scalars (launch configs) are not caches; an int "
            "table holding the slot of a kept output (C4d) passes every static rule and fails "
            "the same runtime checks.", strict="flag"),
    _static("shape_keyed_cache",
            "Keying by shape is normal for kernel configs but can also memoise outputs (catalog "
            "C4); flagged when the stored values are not provably scalars, and the runtime "
            "checks on fresh inputs decide.", strict="flag"),
    _static("global_backend_flags",
            "TF32, cudnn.benchmark or matmul-precision changes give the candidate's library "
            "calls settings the baselines did not get (catalog B6, C8). The runtime probe "
            "compares flags before and after a call, so a change scoped to the call is visible "
            "only here: rejected, except strict's own settings given as literals: "
            "`torch.backends.cudnn.flags(...)` with allow_tf32=False and no benchmark, "
            "`allow_tf32 = False` (matmul, cuDNN) and `set_float32_matmul_precision(\"highest\")`"
            "; a setter kept under a local name escapes this rule and is left to "
            "`backend_flags_changed` when the change persists (B6d). Open: a "
            "flag flipped and restored inside the call through a name the AST cannot resolve "
            "escapes both this rule and the probe, scope or not."),
    _static("torch_compile_or_cuda_graph",
            "torch.compile and CUDA graphs are framework speed-ups, not the candidate's "
            "kernels; a policy may allow them, and they are always recorded (catalog B6, T6)."),
    _static("dynamic_code",
            "Code built from strings or bytes at run time (exec, eval, __import__, unpickling) "
            "is invisible to every static rule here."),
    # ---- runtime: probes, trials and the finished run, judged in the harness ----------------
    _runtime("input_mutation",
             "A forward that writes into its inputs corrupts whatever reuses them (rotated "
             "timing inputs, the caller's tensors); KernelBench passes uncloned inputs."),
    _runtime("no_custom_kernel",
             "A candidate with kernels that never launch, or whose output does not change when "
             "they do nothing, is PyTorch dressed up as a kernel (catalog B5, B1)."),
    _runtime("deferred_work",
             "An output still being written after a probe trial's call returned means work "
             "escaped the call: side streams, deferred launches (catalog T1, T4). In timed "
             "calls the same thing shows as a wrong output (copied when the call returns)."),
    _runtime("background_threads",
             "A thread started by the candidate can finish the work after the timer stopped "
             "(catalog T2)."),
    _runtime("timer_tampering",
             "A replaced timer, synchronisation or comparison function fakes the timings or "
             "the checks (catalog T3, C11)."),
    _runtime("backend_flags_changed",
             "TF32, cudnn.benchmark or precision changes give the candidate numerics or speed "
             "the baselines did not get (catalog B6, C8)."),
    _runtime("nondeterministic",
             "Two calls on the same inputs must agree: reads of uninitialised or stale memory "
             "pass once and fail later (catalog C9); bitwise differences only are flagged.", decided_in="harness"),
    _runtime("precision_below_fp32",
             "An fp32 problem computed in lower precision (fp16, bf16, TF32) can pass a 1e-4 "
             "tolerance on well-scaled outputs while its error against a float64 run is far "
             "above the fp32 reference's own (catalog C8; factor in Policy.precision_factor). "
             "Outputs past Policy.precision_sample_above elements (4 Mi) are compared at a "
             "million secret positions, both fp32 outputs at the same ones: the error is a mean "
             "over elements, and a float64 copy of a 4.3 GB output is 8.6 GB.", decided_in="harness"),
    _runtime("l2_persistence",
             "A persisting-L2 carve-out keeps the candidate's data in the L2 across the flush "
             "between timed calls (catalog T5); kloop resets it before timing."),
    _runtime("protocol_violation",
             "The candidate process wrote messages of its own onto the harness's result "
             "channel (a forged timing, a trial twice): nothing it reports can be trusted "
             "(catalog C11).", kernelbench="reject", decided_in="harness"),
    _runtime("device_busy_beside_baselines",
             "Work of another process's on the device while a baseline is timed slows the "
             "baseline and raises the speedup (K14b). The candidate's process is stopped "
             "while baselines are served and what it left queued drains before each of their "
             "calls; a device found busy before many of them, or busy for 0.5 s (a process of "
             "the candidate's it did not stop, launching still), leaves no baseline that can "
             "be trusted.",
             decided_in="harness"),
    _runtime("implausible_speedup",
             "Speedups above the policy's bound over eager are usually measurement or "
             "correctness holes; flagged for review.", strict="flag", decided_in="harness"),
)

RULES: dict[str, Rule] = {r.name: r for r in _TABLE}


def of_kind(kind: RuleKind) -> dict[str, Rule]:
    """The rules of one kind, in table order."""
    return {n: r for n, r in RULES.items() if r.kind == kind}


def rejected_by(policy: str) -> list[str]:
    """Names of the rules whose violations reject under `policy`."""
    return [n for n, r in RULES.items() if r.severity(policy) == "reject"]
