"""Test doubles for the loop's collaborators: real `EvalResult` records chosen by markers in code.

The FakeEvaluator stands in for the GPU evaluator only; the loop, store, prompts and strategies
under test are the real ones. Markers in a candidate's source pick the verdict:
SYNTAX → compile_error, CRASH → runtime_error, HANG → timeout, BUG → incorrect,
CHEAT → rejected, CUDA_ONLY → not_run, INFRA → the evaluator itself fails (EvalInfraError);
anything else is correct, with `# runtime_ms=X` setting the measured median (default 1.0) and
`# ci=LOW,HIGH` giving its speedup vs eager a 95 % interval over 10 paired rounds.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import re
import threading
import time
from typing import NamedTuple

from kloop.agent.errors import EvalInfraError
from kloop.evaluator.common.result import (
    CompileDiagnostic,
    CompileLog,
    CorrectnessTrial,
    ErrorInfo,
    EvalResult,
    OutputDiff,
    PairedSummary,
    ProfileSummary,
    SpeedupInterval,
    TimingStats,
    Violation,
    WorstElement,
)
from kloop.problems.registry import Problem

EAGER_MS = 2.0


def timing(ms: float, comparable: bool = True) -> TimingStats:
    return TimingStats(median_ms=ms, mean_ms=ms, std_ms=0.0, min_ms=ms, max_ms=ms, iqr_ms=0.0,
                       n_trials=10, clock="cuda_event" if comparable else "host",
                       comparable=comparable)


def kernel(body: str = "", runtime_ms: float | None = None,
           ci: tuple[float, float] | None = None) -> str:
    """A candidate module; `body` carries markers (`ci`: its speedup interval vs eager)."""
    marker = f"# runtime_ms={runtime_ms}\n" if runtime_ms is not None else ""
    marker += f"# ci={ci[0]},{ci[1]}\n" if ci is not None else ""
    return f"import torch\n{marker}{body}\n\nclass ModelNew(torch.nn.Module):\n    pass\n"


def with_interval(result: EvalResult, low: float, high: float, rounds: int = 10,
                  baseline: str = "eager") -> EvalResult:
    """`result` as paired timing records it: its speedup vs `baseline` with a 95 % interval over
    `rounds` paired rounds."""
    ci = {**result.speedup_ci, baseline: SpeedupInterval(low=low, high=high, level=0.95, rounds=rounds)}
    paired = PairedSummary(rounds=rounds, calls_per_round=1, handshake_ms=0.01, baselines=list(ci))
    return result.model_copy(update={"speedup_ci": ci, "paired": paired})


def reply(code: str, words: str = "Here is my kernel.") -> str:
    return f"{words}\n\n```python\n{code}```\n"


class FakeEvaluator:
    """Returns real EvalResult records; counts calls; thread-safe."""

    def __init__(self, comparable: bool = True, delay_s: float = 0.0, held_s: float = 0.0):
        self.calls: list[str] = []
        self.comparable = comparable
        self.delay_s = delay_s
        self.held_s = held_s
        """Each result's device holds (`EvalResult.held_s`), as its reference's and its own."""
        self._lock = threading.Lock()

    def evaluate(self, problem: Problem, source: str) -> EvalResult:
        with self._lock:
            self.calls.append(source)
        time.sleep(self.delay_s)
        if "INFRA" in source:
            raise EvalInfraError("GPU worker lost (fake)")
        base = dict(
            evaluator_version="fake-1", problem_id=problem.id, problem_sha256=problem.sha256,
            candidate_sha256=hashlib.sha256(source.encode()).hexdigest(), policy="strict",
            device="cuda:0" if self.comparable else "cpu", backend="triton",
            started_at="2026-01-01T00:00:00+00:00",
            stage_seconds={"correctness": 0.25, "reference_held": self.held_s / 2,
                           "candidate_held": self.held_s / 2},
        )
        if "SYNTAX" in source:
            line = source[: source.index("SYNTAX")].count("\n") + 1
            log = CompileLog(backend="triton", ok=False, target="sm_90", diagnostics=[
                CompileDiagnostic(file="candidate.py", line=line, column=5,
                                  message="invalid syntax", count=2)])
            return EvalResult(status="compile_error", stage_reached="compile", compile=log, **base)
        if "CRASH" in source:
            err = ErrorInfo(type="RuntimeError", message="index out of range in kernel",
                            traceback='File "candidate.py", line 7, in forward\n    boom()')
            return EvalResult(status="runtime_error", stage_reached="correctness", error=err, **base)
        if "HANG" in source:
            err = ErrorInfo(type="Timeout", message="correctness stage ran past 300 s")
            return EvalResult(status="timeout", stage_reached="correctness", error=err, **base)
        if "CHEAT" in source:
            v = Violation(rule="output_cache", severity="reject", line=3,
                          message="caches outputs across calls keyed by data_ptr")
            return EvalResult(status="rejected", stage_reached="static", violations=[v], **base)
        if "CUDA_ONLY" in source:
            log = CompileLog(backend="cuda", ok=True, target="sm_90 (compile check only)")
            return EvalResult(status="not_run", stage_reached="compile", compile=log, **base)
        if "BUG" in source:
            diff = OutputDiff(ok=False, expected_shape=[8, 32], got_shape=[8, 32],
                              expected_dtype="torch.float32", got_dtype="torch.float32",
                              max_abs_err=0.5, max_rel_err=2.0, mismatch_fraction=0.125,
                              worst=[WorstElement(index=[3, 7], expected=0.25, got=0.75)])
            trials = [CorrectnessTrial(trial=i, passed=False, outputs=[diff]) for i in range(5)]
            return EvalResult(status="incorrect", stage_reached="correctness",
                              correctness=trials, **base)
        m = re.search(r"runtime_ms=([0-9.]+)", source)
        ms = float(m.group(1)) if m else 1.0
        trials = [CorrectnessTrial(trial=i, passed=True) for i in range(5)]
        profile = ProfileSummary(activity="cuda", total_ms=ms, custom_share=0.9,
                                 text="fused_kernel  90%\naten::addmm  10%")
        result = EvalResult(
            status="correct", stage_reached="done", correctness=trials,
            timing=timing(ms, self.comparable), eager=timing(EAGER_MS, self.comparable),
            # A host clock gives no speedup (the evaluator's rule), only the two timings.
            speedup_vs_eager=EAGER_MS / ms if self.comparable else None,
            speedup_vs_best=EAGER_MS / ms if self.comparable else None,
            best_baseline="eager" if self.comparable else None,
            has_custom_kernel=True, profile=profile, **base,
        )
        if (ci := re.search(r"# ci=([0-9.]+),([0-9.]+)", source)) is not None:
            result = with_interval(result, float(ci.group(1)), float(ci.group(2)))
        return result


def make_config(**layer):
    """A RunConfig for L3/1 with a scripted model; keyword args are merged config layers."""
    from kloop.agent.config import resolve

    base = {"model": {"spec": "scripted:unused"}, "problems": ["L3/1"], "concurrency": 1}
    return resolve([base, layer])


def make_runner(tmp_path, replies, evaluator=None, run_id="run", **layer):
    """A Runner over a fresh run directory, with a ScriptedModel of `replies`."""
    from kloop.agent.models.scripted import ScriptedModel
    from kloop.agent.store import RunStore
    from kloop.agent.strategies import Runner

    cfg = make_config(**layer)
    store = RunStore.create(tmp_path / run_id, cfg)
    model = ScriptedModel(replies)
    return Runner(cfg, store, model, evaluator or FakeEvaluator()), model


class KloopResult(NamedTuple):
    exit_code: int
    stdout: str
    stderr: str

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run_kloop(*args: object) -> KloopResult:
    """`kloop ARGS` in this process through `agent.cli.main`, its error handling included."""
    from kloop.agent.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main([str(a) for a in args])
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return KloopResult(code, out.getvalue(), err.getvalue())
