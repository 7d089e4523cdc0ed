"""EvalResult: the versioned, typed record of one candidate's evaluation.

Everything kloop reports comes from these records. They are plain data: no exception objects,
`None` (never -1) where a value does not exist, times in milliseconds, stage wall times in seconds.
Bump `EVAL_SCHEMA_VERSION` on any change that breaks reading old records.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

EVAL_SCHEMA_VERSION = 2

Status = Literal[
    "compile_error",  # the candidate did not build (Python syntax, nvcc, Triton compile)
    "runtime_error",  # it built but crashed, raised, died or ran out of memory
    "timeout",  # a stage ran past its wall-clock limit and was killed
    "incorrect",  # it ran but its outputs do not match the reference
    "rejected",  # a policy or anti-cheat rule refused it
    "correct",  # it matches the reference (timing may still be absent, e.g. on CPU)
    "not_run",  # it cannot run here (CUDA code, no GPU) after a compile check
]
Stage = Literal["static", "compile", "load", "correctness", "timing", "profile", "done"]
Backend = Literal["cuda", "triton", "torch"]
BaselineName = Literal["eager", "compile", "compile_ro"]
"""PyTorch eager, torch.compile (default mode), torch.compile(mode="reduce-overhead")."""


class _Record(BaseModel):
    # NaN/inf (e.g. a worst element the candidate got as NaN) serialise as strings and parse back.
    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")


class ErrorInfo(_Record):
    """An error as data: the exception type name, its message and a trimmed traceback."""

    type: str
    message: str
    traceback: str | None = None
    stderr_tail: str | None = None
    """Last lines of the candidate process's stderr (crashes, segfaults, CUDA errors)."""


class CompileDiagnostic(_Record):
    """One compiler message, deduplicated."""

    file: str | None = None
    line: int | None = None
    column: int | None = None
    severity: Literal["error", "warning"] = "error"
    message: str
    count: int = 1
    """How many times this same message appeared (e.g. once per template instantiation)."""


class KernelResources(_Record):
    """Per-kernel resource use reported by ptxas/cuobjdump for the compiled target."""

    kernel: str
    registers: int | None = None
    spill_bytes: int | None = None
    """Bytes of spill stores (ptxas -v), when known."""
    local_bytes: int | None = None
    """Local memory per thread (spills and local arrays), from cuobjdump."""
    shared_bytes: int | None = None


class CompileLog(_Record):
    backend: Backend
    ok: bool
    infra_error: str | None = None
    """Set when the compile check could not be completed for a reason that is not the candidate's
    fault (a missing SDK header on this machine, no nvcc, a compiler timeout). `ok` is then False
    and the verdict must not be `compile_error`."""
    diagnostics: list[CompileDiagnostic] = Field(default_factory=list)
    log_tail: str = ""
    """The last part of the full compiler output (the full log is in `log_path`)."""
    log_path: str | None = None
    cache_hit: bool = False
    target: str | None = None
    """What was compiled for, e.g. `sm_90` or `host-only check`."""
    resources: list[KernelResources] = Field(default_factory=list)
    seconds: float | None = None
    """Wall time of the build or check (near zero on a cache hit)."""
    nvcc_runs: list[str] = Field(default_factory=list)
    """GPU builds: what each nvcc run did, as the compile child reported it
    (`evaluator.build.nvcc_parallel`: `split`, `lean`, `lean refused: <why>`, `lean failed: …`,
    `torch form (host pch)` or `(host without pch)`, `torch form refused: <why>`, `torch form
    failed: …`, or `plain: <why>`). Empty for CPU compile checks (one plain check each)."""
    cxx_runs: list[str] = Field(default_factory=list)
    """Each compile of `load_inline`'s binding file (`evaluator.build.cxx_pch`): `pch` (torch's
    header precompiled by the trusted builder) or `plain: <why>`."""


class WorstElement(_Record):
    index: list[int]
    expected: float
    got: float


class OutputDiff(_Record):
    """Comparison of one output tensor of the candidate with the reference."""

    output_index: int = 0
    ok: bool
    expected_shape: list[int]
    got_shape: list[int] | None = None
    expected_dtype: str
    got_dtype: str | None = None
    got_type: str | None = None
    """Python type of what the candidate returned, when it is not a plain torch.Tensor."""
    max_abs_err: float | None = None
    max_rel_err: float | None = None
    mismatch_fraction: float | None = None
    worst: list[WorstElement] = Field(default_factory=list)
    nan_expected: int = 0
    nan_got: int = 0
    inf_expected: int = 0
    inf_got: int = 0
    message: str | None = None


class CorrectnessTrial(_Record):
    trial: int
    kind: str = "random"
    """`random` (fresh get_inputs seed), `reparam` (a second build under another seed), or
    `timed` (a timed call whose output was wrong; trial 1000 + its index)."""
    passed: bool
    outputs: list[OutputDiff] = Field(default_factory=list)
    message: str | None = None


class PrecisionCheck(_Record):
    """The candidate's error against a float64 run of the reference, next to the fp32
    reference's own (relative RMS over all floating outputs of the first probe trial)."""

    candidate_rel_err: float
    reference_rel_err: float
    factor: float
    """Flagged `precision_below_fp32` when candidate > factor * max(reference, floor)."""
    floor: float
    ok: bool
    positions: int | None = None
    """Large outputs were compared at this many secret positions (`Policy.precision_sample`);
    None: every element."""


class GpuSample(_Record):
    """The device as NVML saw it at one moment (`evaluator.harness.gpustate`); None where a
    reading was not available."""

    sm_clock_mhz: int | None = None
    mem_clock_mhz: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    clock_limits: list[str] | None = None
    """Why the clocks are below their maximum right then (`gpu_idle`, `sw_power_cap`,
    `hw_thermal`...), as NVML's clock-event reasons."""


class BoundedEvents(_Record):
    """The worker's own CUDA-event time of each timed call, kept inside the interval the trusted
    clock allows for that call: at most its wall time less the handshake (`TimingStats.
    handshake_ms`), at least its wall time less `bound_ms`. The events are the process's word
    (a candidate can forge them); the interval is the harness's. So a forged event moves a
    number by at most `bound_ms - handshake_ms` per call, and an honest one is the number
    KernelBench would report. The `kernelbench` policy computes its speedups from these
    (`Policy.timing_of_record`); `strict` never does."""

    median_ms: float
    mean_ms: float
    std_ms: float
    min_ms: float
    max_ms: float
    bound_ms: float
    """The most serving overhead (wall minus events) one call may hide: the 90th percentile of
    the trusted reference worker's own calls in this evaluation, never below the handshake."""
    raised: int
    """Calls whose event time was below `wall - bound_ms` (moved up to it)."""
    lowered: int
    """Calls whose event time was above `wall - handshake` (moved down to it)."""


class TimingStats(_Record):
    median_ms: float
    mean_ms: float
    std_ms: float
    min_ms: float
    max_ms: float
    iqr_ms: float
    n_trials: int
    clock: Literal["cuda_event", "host", "harness"]
    """Which clock produced the numbers. `harness`: the trusted clock (`evaluator.harness.clock`),
    wall time in the harness process from the call's request to the copy of its output, net of
    the handshake; `cuda_event`/`host`: timed inside a worker (records from before 0.2)."""
    comparable: bool
    """False for timings on CPU: they are not comparable with GPU numbers."""
    raw_median_ms: float | None = None
    """`harness` clock: the median before the handshake was taken off."""
    handshake_ms: float | None = None
    """`harness` clock: taken off every call: the fastest null call (same request, input draw
    and output copy, no model) in the trusted reference worker's session (for a candidate: or
    in its own session, whichever is faster), a lower bound of what serving a call costs. The
    numbers of record are therefore never smaller than the work, and may be larger by the rest
    of the clock's overhead (GPU_VALIDATION.md has its size on the H200)."""
    null_call_ms: float | None = None
    """`harness` clock: the median of those null calls."""
    calibrated_median_ms: float | None = None
    """A best estimate, not the number of record: the raw median less the overhead the reference
    worker's own calls show (its wall time minus its trusted CUDA events). It assumes the
    candidate serves calls as slowly as the reference worker, which native code could undercut."""
    worker_event_median_ms: float | None = None
    """The worker's own CUDA-event median of the forward: what the process says, kept as a
    cross-check only (a candidate's process can forge it)."""
    events: BoundedEvents | None = None
    """The worker's events, each bounded by the trusted clock (GPU runs with a known bound)."""
    measured_as: Literal["reference", "candidate"] | None = None
    """Baselines: served by the reference worker; `candidate` only in results from before
    2026-12-05, whose eager baseline could be the reference's own code judged as a candidate (a
    mode since removed); None: a candidate's own timing."""
    gpu_before: GpuSample | None = None
    """The GPU just before the first timed call (NVML, read by the harness; GPU runs only)."""
    gpu_after: GpuSample | None = None
    """The GPU just after the last timed call."""


class ProfileKernel(_Record):
    name: str
    kind: Literal["custom", "library"]
    time_ms: float
    share: float
    calls: int


class NcuMetrics(_Record):
    """Nsight Compute's numbers for one launch of one kernel (`evaluator.harness.ncu`); percentages are
    of the device's peak."""

    kernel: str
    duration_us: float | None = None
    dram_throughput_pct: float | None = None
    sm_throughput_pct: float | None = None
    achieved_occupancy_pct: float | None = None
    registers_per_thread: int | None = None
    spill_bytes: int | None = None
    l2_hit_rate_pct: float | None = None
    theoretical_occupancy_pct: float | None = None
    """The occupancy the launch's resources allow (registers, shared memory, block size)."""
    block_size: int | None = None
    grid_size: int | None = None
    static_shared_bytes: int | None = None
    dynamic_shared_bytes: int | None = None
    blocks_limit_registers: int | None = None
    """Blocks one SM could hold if registers were the only limit (likewise shared memory and
    warps below): the smallest of the three caps the theoretical occupancy."""
    blocks_limit_shared_mem: int | None = None
    blocks_limit_warps: int | None = None
    sm_count: int | None = None
    """SMs on the device the kernel ran on."""
    stalls: dict[str, float] = Field(default_factory=dict)
    """Warp-stall reason -> warps stalled for it per issued instruction (`ncu.STALL_REASONS`)."""

    @property
    def shared_bytes(self) -> int | None:
        """Shared memory per block, static and dynamic together."""
        parts = [b for b in (self.static_shared_bytes, self.dynamic_shared_bytes) if b is not None]
        return sum(parts) if parts else None


class ProfileSummary(_Record):
    activity: Literal["cuda", "cpu"]
    total_ms: float
    custom_share: float | None
    """Share of device time in the candidate's own kernels (None when it has none)."""
    kernels: list[ProfileKernel] = Field(default_factory=list)
    text: str = ""
    """Compact rendering (at most 40 lines) for the model's feedback."""
    ncu: NcuMetrics | None = None
    """The first of `ncu_kernels`, kept for readers of records from before that list."""
    ncu_kernels: list[NcuMetrics] = Field(default_factory=list)
    """Nsight Compute metrics of the custom kernels that dominate the profile, one launch each,
    most device time first (`EvalConfig.ncu`)."""

    @model_validator(mode="after")
    def _ncu_kernels_of_old_records(self) -> ProfileSummary:
        if self.ncu is not None and not self.ncu_kernels:
            self.ncu_kernels = [self.ncu]
        return self


class Violation(_Record):
    """A policy or anti-cheat rule that fired."""

    rule: str
    severity: Literal["reject", "flag"]
    message: str
    line: int | None = None


class EnvInfo(_Record):
    python: str
    torch: str
    triton: str | None = None
    cuda: str | None = None
    device_name: str
    gpu_arch: str | None = None
    driver: str | None = None
    hostname: str | None = None


class SpeedupInterval(_Record):
    """A bootstrap interval of one speedup over the paired rounds (`evaluator.harness.paired`)."""

    low: float
    high: float
    level: float
    rounds: int
    """Rounds both sides completed (the unit the bootstrap resamples)."""


PlanSource = Literal["policy", "kept_worker", "earlier_evaluation", "warm_up", "unmeasured"]


class TimingPlan(_Record):
    """How many timed calls each side of the paired rounds got, and why
    (`evaluator.harness.budget`): decided before the evaluation's reference stage from what
    the trusted reference measured, never from anything of the candidate's."""

    calls: int
    """Timed calls per side (every one checked, every one timed)."""
    full: int
    """The policy's count (`Policy.timing_trials`, or the CPU's): what an unbudgeted run makes."""
    budget_ms: float | None = None
    """The policy's device time for one side's timed calls (`Policy.timing_budget_ms`)."""
    eager_ms: float | None = None
    """The eager calls' wall median (the handshake in: what a call costs the rounds) the count
    was read from; None: none was measured yet, or no budget applies."""
    source: PlanSource = "policy"
    """Where `eager_ms` came from, in this process and at the full count: `kept_worker` (its
    start), `earlier_evaluation` (an earlier evaluation of the problem), `warm_up` (the
    baselines' warm-up, `kloop baseline`); `unmeasured` (none yet: the full count); `policy`
    (no budget applies: its count)."""


class PairedSummary(_Record):
    """How the candidate and its baselines were timed side by side."""

    rounds: int
    """Rounds run (every one, unless the sequential rule stopped them: `stopped_early`)."""
    calls_per_round: int
    stopped_early: bool = False
    """The sequential rule (`Policy.timing_stop_width`) stopped the rounds after their first
    half: every interval was narrow by then. Each side then has about half `plan.calls`."""
    width_at_check: float | None = None
    """The widest speedup interval at the rule's check, (high - low) over its midpoint: what
    the rule compared with its width (None: no check was made)."""
    plan: TimingPlan | None = None
    """How many timed calls each side got and why (None: records from before budgets)."""
    handshake_ms: float | None
    """The fastest of the reference worker's null calls in these rounds: what every side's calls
    are net of (never the candidate process's own)."""
    baselines: list[BaselineName] = Field(default_factory=list)
    """The baselines timed in the rounds (one that failed there is left out, and flagged)."""
    unpaired_eager_ms: float | None = None
    """The eager baseline's median from the reference worker's own session earlier (a start-up
    aid only, never divided): kept to show how far an unpaired speedup would have moved."""
    resolution_multiple: float | None = None
    """The eager baseline's median over the handshake: below `RESOLUTION_MULTIPLE` the clock's
    overhead is a large share of every call (flag `below_clock_resolution`)."""


class HeadToHead(_Record):
    """The challenger timed against an incumbent in the same rounds (`evaluator.harness.headtohead`)."""

    ratio: float | None
    """The incumbent's time over the challenger's, on the speedups' clock and statistic: above
    1 the challenger is faster. None: the comparison was void (see `note`)."""
    low: float | None = None
    high: float | None = None
    level: float = 0.95
    rounds: int = 0
    incumbent_sha256: str
    note: str | None = None


class EvalResult(_Record):
    schema_version: int = EVAL_SCHEMA_VERSION
    evaluator_version: str
    status: Status
    stage_reached: Stage
    backend: Backend | None = None
    has_custom_kernel: bool | None = None
    problem_id: str
    problem_sha256: str
    candidate_sha256: str
    policy: str
    tolerance: float | None = None
    """atol = rtol the outputs were compared with: the policy's for the run's precision
    (`Policy.tolerance`); None in records written before it was kept."""
    device: str
    problem_overrides: dict[str, Any] = Field(default_factory=dict)
    """Module constants of the problem replaced for this run (e.g. reduced sizes in CI)."""
    compile: CompileLog | None = None
    correctness: list[CorrectnessTrial] = Field(default_factory=list)
    timing: TimingStats | None = None
    eager: TimingStats | None = None
    compiled: TimingStats | None = None
    """The torch.compile baseline."""
    compiled_ro: TimingStats | None = None
    """The torch.compile(mode="reduce-overhead") baseline (CUDA graphs); None where it was not
    asked for (CPU by default), failed (flagged `baseline_compile_ro_failed`) or predates it."""
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    speedup_vs_compile_ro: float | None = None
    speedup_vs_best: float | None = None
    """Against the fastest baseline this result has a speedup for: the smallest of the three
    speedups (`evaluator.harness.baselines.best_of`)."""
    best_baseline: BaselineName | None = None
    """Which baseline that was; None where there is no speedup at all."""
    speedup_ci: dict[BaselineName, SpeedupInterval] = Field(default_factory=dict)
    """Each speedup's 95 % bootstrap interval over the paired rounds; empty where the speedup
    was not measured in paired rounds."""
    paired: PairedSummary | None = None
    head_to_head: HeadToHead | None = None
    """Set when this evaluation was asked to time an incumbent beside it."""
    precision_calls: int = 0
    """Timed calls (chosen in secret) whose outputs were also checked against float64; each must
    pass `precision_below_fp32`'s test, like the first probe trial."""
    speedup_clock: Literal["harness", "events_bounded"] | None = None
    """Which numbers `speedup_vs_eager` divides: the trusted clock's (`TimingStats.median_ms`
    etc.) or the bounded events (`TimingStats.events`), as the policy asks where both sides have
    them. `speedup_vs_compile` and `speedup_vs_compile_ro` use the same, or the trusted clock's
    where the baseline (cached from before events were bounded) has none."""
    profile: ProfileSummary | None = None
    precision: PrecisionCheck | None = None
    violations: list[Violation] = Field(default_factory=list)
    flags: list[str] = Field(default_factory=list)
    error: ErrorInfo | None = None
    stage_seconds: dict[str, float] = Field(default_factory=dict)
    env: EnvInfo | None = None
    started_at: str
    """ISO-8601 UTC time at which evaluation started."""

    @property
    def correct(self) -> bool:
        return self.status == "correct"

    @property
    def runtime_ms(self) -> float | None:
        return self.timing.median_ms if self.timing else None

    @property
    def held_s(self) -> float:
        """Seconds this evaluation held its device (GPU-seconds on a GPU): the device lock's
        holds of its reference worker, its candidate child (an incumbent's too), a kept
        baseline worker it started, and its ncu pass (`stage_seconds`). A reference worker's
        shared hold (`reference_shared`, beside other evaluations' reference workers) counts
        whole, as if alone: never less than the device gave it. Its wall seconds also count
        its builds, its processes' starts and its wait for the lock, which depend on what ran
        beside it."""
        return sum(v for k, v in self.stage_seconds.items()
                   if k.endswith(("_held", "_shared"))) + self.stage_seconds.get("ncu", 0.0)
