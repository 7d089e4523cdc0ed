"""Evaluation configuration: `EvalConfig` (what to run, where, with which limits) and the named
policies (how strictly to judge).

A policy is the part of the configuration that decides what a number *means* (tolerances,
trial counts, TF32, which statistic drives the speedup), so it is named and recorded in every
result. `EvalConfig` holds the operational knobs (device, timeouts, memory, caches).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Precision = Literal["fp32", "fp16", "bf16"]
BaselineMode = Literal["auto", "eager", "compile", "both", "all", "none"]


class Policy(BaseModel):
    """How a candidate is judged. Frozen: a policy is identified by its name. What each
    anti-cheat rule gives under it (reject or flag) is in the rule table, `evaluator.common.rules`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    description: str
    tol_fp32: float = 1e-4
    """atol = rtol for fp32 runs (`torch.allclose` semantics: |a-b| <= atol + rtol*|b|)."""
    tol_half: float = 1e-2
    """atol = rtol for fp16 and bf16 runs."""
    correct_trials: int = 5
    """Correctness trials on fresh random inputs."""
    allow_tf32: bool | None = False
    """TF32 for matmul and cuDNN, set identically in reference and candidate before anything is
    built. None leaves PyTorch's defaults (cuDNN TF32 on, matmul off)."""
    timing_trials: int = 100
    """Timed calls per side of the paired rounds, at most (the full count)."""
    timing_budget_ms: float | None = 250.0
    """Device time for one side's timed calls: a problem whose eager median times the full count
    exceeds it gets fewer calls, down to `timing_min_trials`, on a fixed ladder
    (`evaluator.harness.budget`); its interval says what that costs. None: always the full count."""
    timing_min_trials: int = Field(20, ge=1)
    """The fewest timed calls per side a budget may leave (two per round at ten rounds)."""
    timing_stop_width: float | None = Field(None, gt=0)
    """The rounds' sequential rule: after the first half of the rounds, stop once every
    speedup's interval is narrower than this share of its midpoint ((high - low) / ((high + low)
    / 2)), on the trusted clock. The timed calls the precision check reads are drawn half from
    the first half of the rounds and half from the rest (`judge.served64`), so a stop leaves it
    whole and a kernel cannot lower its precision only late. None: every round runs. Not with
    an incumbent in the rounds (a head-to-head runs whole)."""
    warmup_calls: int = 3
    warmup_ms: float = 25.0
    """After the warm-up calls, keep calling until this much host time has passed."""
    speedup_stat: Literal["median", "mean"] = "median"
    """Which timing statistic the speedups are computed from."""
    timing_of_record: Literal["harness", "events_bounded"] = "harness"
    """`harness`: the trusted clock's wall time per call less the fastest null call, a number
    no candidate can push below its work (its serving overhead stays in: 0.05-0.3 ms per call
    on the H200). `events_bounded`: the worker's CUDA events, each kept within the trusted
    clock's interval for its call (`result.BoundedEvents`): KernelBench's own measure, which a
    forging candidate can move by at most the recorded bound. Used only where the candidate
    and the baseline both have them; `EvalResult.speedup_clock` says which was used."""
    noisy_construction: bool = True
    """Build every model (reference and candidate) under a secret construction seed with
    `torch.nn.init`'s constant fills made noisy (`construct.noisy_model`): no initial value can
    be assumed and no build can be told from another. Off: KernelBench's seed 42."""
    degenerate_trials: bool = True
    """On problems whose output does not depend on the input at this tolerance: where the
    problem has an input scale that makes it depend (`ProblemMeta.degenerate_input_scale`),
    every input of every call is scaled by it; where only other weights move the output, add
    the reparam trial."""
    whole_input_trials: bool = True
    """On sequence problems whose output forgets the start of the sequence at this tolerance
    (`ProblemMeta.prefix`), every floating input of every call is drawn from the distribution
    recorded there (`strict_input_scale` * x + `strict_input_shift`), under which the first half
    of the sequence moves the output beyond the tolerance: a candidate that runs only the last
    steps fails (scripts/probe_prefix.py, CPU fp32, 2026-12-05). Off: KernelBench's inputs,
    the result flagged `prefix_unprobed`."""
    reparam_trial: bool = True
    """One probe trial on a second model of each side, built alike under another secret seed
    (`construct.noisy_model`; inside the constructor, so weights an honest candidate packs in
    `__init__` stay valid): kernels that keep weights from an earlier build fail it."""
    precision_factor: float | None = 100.0
    """fp32 runs: the candidate's error against a float64 reference may be at most this many
    times the fp32 reference's own (`evaluator.harness.precision`); None: not checked."""
    precision_sample_above: int | None = 1 << 22
    """Float64 outputs past this many elements are kept at `precision_sample` secret positions,
    where the precision check then compares both fp32 outputs too (`evaluator.common.sample`:
    an evaluation made four float64 outputs, 34 GB of them for L3/17 at full size); None: kept
    whole."""
    precision_sample: int = Field(1 << 20, ge=1)
    """How many positions a sampled float64 output keeps."""
    require_custom_kernel: bool = False
    """Reject plain-PyTorch candidates (no kernel of their own) that would otherwise be correct.
    Off: they are judged on their outputs and flagged `no_custom_kernel`; a candidate whose own
    kernels never launch or do not matter is rejected either way."""
    excessive_speedup: float = 10.0
    """Flag (never fail) speedups over eager above this factor."""

    def tolerance(self, precision: Precision) -> float:
        return self.tol_fp32 if precision == "fp32" else self.tol_half


POLICIES: dict[str, Policy] = {
    p.name: p
    for p in (
        Policy(
            name="strict",
            description="Isolated run, the harness's clock, every timed call checked on fresh "
            "secret inputs, models built under secret seeds with noisy constant fills, TF32 off, "
            "degenerate problems scaled into input dependence, sequence problems drawn so that "
            "the whole sequence matters, float64 precision check, runtime "
            "anti-cheat rules and input mutation rejected; median for speedups over paired rounds "
            "of 100 timed calls a side, fewer (20 at least) for a model whose calls exceed "
            "250 ms of device time a side, stopped after half the rounds where every speedup's "
            "interval is within 2 % of its midpoint by then.",
            timing_stop_width=0.02,
        ),
        # KernelBench main: same tolerances and trial counts, PyTorch's default backend flags,
        # the mean of 100 L2-flushed trials on one input set. Process isolation stays: it
        # changes no number, only what a crashing or cheating candidate can do.
        Policy(
            name="kernelbench",
            description="Reproduces KernelBench main: tol 1e-4 fp32 / 1e-2 fp16+bf16, 5 trials, "
            "PyTorch default backend flags, mean of 100 L2-flushed trials, timed by CUDA events "
            "kept within the harness clock's bounds.",
            allow_tf32=None,
            speedup_stat="mean",
            timing_of_record="events_bounded",
            noisy_construction=False,
            degenerate_trials=False,
            whole_input_trials=False,
            reparam_trial=False,
            timing_budget_ms=None,
        ),
    )
}


class Comparison(BaseModel):
    """How one configuration builds, compares and times, as the prompts tell the model
    (`EvalConfig.comparison`); each result records its own `EvalResult.tolerance`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    policy: str
    precision: Precision
    """The dtype models and inputs are cast to; outputs are widened to fp32 to be compared."""
    tolerance: float
    """atol = rtol: |got - expected| <= tolerance + tolerance * |expected|, elementwise."""
    noisy_construction: bool = True
    """Models are built under a secret seed with noisy constant fills (`Policy.noisy_construction`);
    False: right after `torch.manual_seed(42)`."""
    timing_of_record: Literal["harness", "events_bounded"] = "harness"
    """The clock the speedups come from (`Policy.timing_of_record`)."""
    speedup_stat: Literal["median", "mean"] = "median"


class UnknownPolicyError(ValueError):
    """A policy name that is not in `POLICIES`."""


def get_policy(name: str) -> Policy:
    """The named policy; unknown names list the known ones."""
    try:
        return POLICIES[name]
    except KeyError:
        known = ", ".join(sorted(POLICIES))
        raise UnknownPolicyError(f"unknown policy {name!r}; known policies: {known}") from None


class StageTimeouts(BaseModel):
    """Wall-clock limits in seconds, per stage of a child process."""

    model_config = ConfigDict(extra="forbid")

    startup: float = 120.0
    """From spawn until the child reports its first stage (interpreter and torch imports)."""
    compile: float = 900.0
    """Compile-only child: importing the candidate builds its extensions (nvcc can be slow)."""
    load: float = 900.0
    """Candidate child: import the candidate (builds extensions unless cached) and build ModelNew."""
    correctness: float = 300.0
    timing: float = 600.0
    profile: float = 300.0
    reference: float = 600.0
    """Reference worker: build the reference, draw inputs, compute expected outputs."""
    baselines: float = 1800.0
    """Reference worker: time the eager and torch.compile baselines, both modes (each compile
    includes inductor; CUDA graphs capture for reduce-overhead)."""


REMOVED: dict[str, str] = {
    "jit_warmup": "the JIT warm-up pass under a shared device lock: 0.90-1.02x candidates per "
                  "GPU-hour on the H200",
    "jit_prime": "compiling Triton kernels before the device lock: never measured as a win",
    "cuda_init": "CUDA contexts made before the device lock: 0.1-0.2 s less per reference hold "
                 "on the H200, and a wider timing tail for whoever is timed beside them",
    "eager_baseline_from": "the eager baseline measured by judging the reference as a "
                           "candidate: superseded by paired timing (`evaluator.harness.paired`)",
    "device_lock": "`process`, a device lock among one process's evaluations only: concurrent "
                   "processes timed under each other's load; the lock is always the host's",
    "template_process": "`false`, children started as fresh interpreters where the template "
                        "process works: they lose its containment (`isolation_uncontained`)",
}
"""Mechanism settings removed on 2026-12-05 (docs/performance.md has their measurements) -> what
they chose and why they went. The evaluator runs as each one's default did. Naming one is an
error that says so; a run's saved config from before the removal drops them on reading
(`without_removed`), so old runs still read and start again."""


def without_removed(fields: dict[str, Any]) -> dict[str, Any]:
    """`EvalConfig` fields as a record written before the removal holds them, without the
    removed ones."""
    return {k: v for k, v in fields.items() if k not in REMOVED}


def _default_cache_dir() -> Path:
    return Path(os.environ.get("KLOOP_CACHE_DIR", Path.home() / ".cache" / "kloop"))


class EvalConfig(BaseModel):
    """Everything `evaluate` needs besides the problem and the candidate source."""

    model_config = ConfigDict(extra="forbid")

    policy: str = "strict"
    """Name of a policy in `POLICIES`."""
    device: str = "auto"
    """`auto` (every visible GPU, else cpu), `cpu`, `cuda` (every visible GPU) or `cuda:N` (that
    one). With several GPUs each evaluation takes the least busy one (`evaluator.procs.devicepool`)."""
    precision: Precision = "fp32"
    problem_overrides: dict[str, Any] = Field(default_factory=dict)
    """Module-level constants of the problem replaced before use, in reference and candidate
    (e.g. `{"batch_size": 2}`), so CI can run problems at reduced sizes."""
    timeouts: StageTimeouts = Field(default_factory=StageTimeouts)
    cpu_memory_limit_gb: float = 8.0
    """Address-space limit (RLIMIT_AS) of a child on CPU; CUDA children cannot use it."""
    host_rss_limit_gb: float = 64.0
    """The harness kills a child whose resident memory exceeds this."""
    disk_limit_gb: float = 16.0
    """The harness kills a child that runs candidate code once its evaluation's dir holds more
    than this (or 200,000 entries) beyond what its own trial outputs take at the problem's full
    size (all of them at once: L3/17's seven are 30 GB): the disk is shared with every other
    evaluation."""
    cpu_timing_trials: int = 5
    """Host-clock timing trials on CPU (not comparable with GPU numbers)."""
    cpu_warmup_calls: int = 1
    cpu_threads: int = 1
    """Intra-op threads of CPU children (OMP_NUM_THREADS): one by default, so parallel
    evaluations on a small machine do not oversubscribe it."""
    baselines: BaselineMode = "auto"
    """Which reference baselines to time: `both` is eager and torch.compile, `all` adds
    torch.compile(mode="reduce-overhead") (CUDA graphs: one more compile per problem, cached
    like the others); `auto` is `all` on CUDA and eager only on CPU (where reduce-overhead
    has no CUDA graphs and is flagged `baseline_compile_ro_no_cudagraphs` if asked for)."""
    kept_baselines: int | None = Field(None, ge=0)
    """Baseline workers kept between evaluations of one problem in this process
    (`evaluator.harness.servers`): the paired rounds time the candidate against a worker whose
    models (eager, and torch.compile in both modes, compiled once) outlive the evaluation,
    instead of against the evaluation's own reference worker, whose compiled baselines came
    from the cache and were compiled again under the device lock for every candidate (2.7-17.5 s
    of each correct candidate's hold at full size on the H100, 2026-12-05 at 92b4b81). At most
    this many, the least recently used closed first. Each evaluation's own reference worker
    still makes every output its candidate is checked against. 0: none kept; None: on a GPU as
    many as the device's and the host's memory leave room for (30 % of the device's memory and
    16 GiB of the host's kept free, at most 32; 4 where NVML cannot be read), 0 on CPU (no
    compiled baselines there)."""
    reference_hold: Literal["shared", "exclusive"] = "shared"
    """How an evaluation's own reference worker holds the device where a kept baseline worker
    times the baselines (`kept_baselines`): `shared`, beside other such reference workers and
    never beside a timing or candidate code (`evaluator.procs.devicelock`), making outputs only:
    the probe trials' expected outputs and every timed call's, served without the clock's
    preparation, null calls or warm-up. Nothing measured under a shared hold is a number of
    record: the eager baseline, the handshake and the event bound come from the kept worker's
    start, measured alone. `exclusive`: alone, as every device child before 2026-12-06."""
    baseline_start_hold: Literal["exclusive", "shared"] = "shared"
    """How a kept baseline worker's start holds the device (`evaluator.harness.servers`):
    `exclusive`, alone from its first device call to its park (its compiles and CUDA graph
    captures, then its timed calls); `shared`, its roles compiled and warmed beside other
    trusted work that times nothing (other starts, reference workers making outputs), then its
    timed calls alone (`servers.time_roles`), so the starts of several problems overlap. On
    L3/4 an exclusive start held the device alone 11.1 s, about a second of it timed calls; a
    shared one 1.3 s (an H100, 2026-12-06). Part 1 of the figure of record (three problems at
    full size, 8 at once, fresh H100s): the warm-up of its three starts 50.5 s shared against
    83.2 s exclusive, first use included 131.7 s against 188.9 s (two machines, 2026-12-06)."""
    candidate_hold: Literal["exclusive", "untimed_shared"] = "exclusive"
    """How a candidate child holds the device (`evaluator.procs.devicelock`): `exclusive`, alone
    from its first device work to its end; `untimed_shared`, its load and correctness trials
    beside other evaluations' outputs-only reference workers (`reference_hold`: trusted, timing
    nothing; never beside a kept worker's start or another candidate), then alone from its
    first timed call to its end, its process never without a hold in between. The reference
    workers' outputs otherwise run in gaps between candidates' holds in which nothing is
    timed: 19 s of part 1's 69 s steady pass (three problems at full size, 8 at once, an H100,
    2026-12-06 at 1ec59dd). What a candidate can do to a worker beside it is make it run out of
    device memory (judged again alone: a cost) or run slowly (it times nothing): no number
    changes. Off by default: on the same warm batch side by side (one pass each, an H100,
    2026-12-06) it gave 766 against 703 candidates per GPU-hour, but the exclusive pass carried
    the machine's first CUDA builds and the candidates' holds grew (p90 9.8 against 7.4 s) by
    about what the filled gaps gave back; the GPU lock test and every exploit reached passed
    with it on. In the other order, both passes on warm builds (another H100, the same day):
    930 against 929 (1.00x), the holds again longer shared. No gain, so off."""
    l2_flush: Literal["worker", "trusted"] = "worker"
    """Who flushes the L2 before each timed call: the serving process in its `prep` (a
    candidate's native code could skip it), or also a trusted flusher process of the harness's
    on the same device (`evaluator.harness.flusher`; on CPU it runs the protocol only).
    `worker` by default: the trusted flush multiplied a 0.13 ms model's median by 3.7 and a
    0.8-4 ms model's by 0.88-1.02 (`bench/clock.py`, the H200, 2026-12-01 at 6feb02e)."""
    profile: bool = True
    """One profiled forward for correct candidates."""
    profile_trials: bool = False
    """Diagnostics (`bench/experiment.py --profile-trials`): each probe trial of the candidate
    child under cProfile, its top entries, wall and CPU time back as a flag. The numbers are the
    candidate process's own (forgeable) and judge nothing."""
    construct_at: Literal["auto", "before_lock", "under_lock"] = "auto"
    """Where the candidate child imports the candidate and builds `ModelNew` (and the reparam
    trial's second model): `under_lock`, after the harness took the device lock for it; or
    `before_lock`, on CPU before it reports ready, in a process that cannot reach the GPU
    (its device nodes are /dev/null in its mount namespace) and runs at SCHED_IDLE; once the
    harness holds the lock it uncovers the nodes and restores SCHED_OTHER, and the child only
    moves its models to the device. At full sizes the build is seconds of host work (L3/1's
    671 M parameters: `load` 4.5-7.5 s under the lock on the H200) during which the GPU idles.
    A candidate whose work before the lock fails in any way (a constructor that needs the
    device, a CUDA call that leaves the process unable to use it) is judged again the usual
    way in a new child, flagged `constructed_under_lock` (with the first `torch.cuda` query
    made before the lock, where it was made). `auto`: `before_lock` where the harness can
    uncover and restore (root with SYS_ADMIN, SYS_CHROOT, SYS_PTRACE and SYS_NICE, and the
    template process), else `under_lock`. On the H200 at full size (10 Triton candidates,
    L3/1 and L3/4, 8 at once): 522 vs 413 candidates per GPU-hour side by side (1.26x), GPU busy
    51 % vs 39 %, `load` under the lock 0.19 s p50 vs 1.89 (2026-12-03 at 1b2062d)."""
    pch: Literal["auto", "on", "off"] = "auto"
    """Precompiled torch header for `load_inline`'s binding file (`evaluator.build.pch`, made by
    trusted code under torch's own flags for the common calls; g++ uses it only where it is
    valid, so the binary is the one the plain build makes). `auto`: builds use a PCH that is
    there, and a CUDA build on a GPU host starts making the missing ones in the background;
    `on`: also on a CPU host (for CPU-only extensions; ~50 s of one core per variant);
    `off`: neither. On a host without a GPU, `auto` and `on` also make the compile check's own
    (g++ over main.cpp in `nvcc_check`: 17.2 s plain, 5.3 s with it, 36 s to make once; the
    2-core CPU host, 2026-12-06). The binding file built in 12.6 s with it against 29.1 s without, identical
    `objdump -d -s` (the CPU host, 2026-12-03 at cdc2876); on the H200 a torch-free candidate's
    cold build, lean and with it, 8.28 s p50 against plain `load_inline`'s 23.13 s (2026-12-04
    at 680c4de)."""
    lean_cuda: Literal["off", "on"] = "on"
    """`on`: a `load_inline` `.cu` whose own text uses nothing of torch is built with the
    standard and CUDA headers `<torch/types.h>` includes in place of it (`evaluator.build.lean`
    has the rule; the same device code; on the H200 host a torch-free candidate's cold build
    33.1 -> 9.0 s beside plain `load_inline`, 2026-12-04 at 16f8da0); anything else, or
    a lean build that fails, is built the plain way. The CUDA prompt asks for such a `.cu`
    (kernels and raw-pointer launchers; the `torch::Tensor` wrappers in `cpp_sources`).
    `off`: every `.cu` the plain way."""
    build_slots: int | None = Field(None, ge=1)
    """Compile children at once on this host, across every kloop process sharing `cache_dir`
    (`evaluator.procs.buildslots`; None: half the cores). Evaluations past it wait for a slot
    (`stage_seconds.build_wait`)."""
    hidden_from_builds: list[str] = []
    """More paths a compile child cannot open, besides the GPU's device nodes (which are always
    hidden from it where the harness can: a root harness and the template process)."""
    child_writable: list[str] = []
    """Directories that children running candidate code may still write where the rest of the
    file tree is read-only for them (root without capabilities, a non-root harness): the
    tests' drop boxes. Never put anything here that the harness reads as trusted."""
    ncu: bool = False
    """Also collect Nsight Compute metrics for the custom kernels that dominate a correct
    candidate's profile (GPU with ncu only), shown in the next turn's feedback. Off by default:
    the ncu run (`stage_seconds["ncu"]`, seconds to tens of seconds) is evaluation time, charged
    to the `eval_s` budget."""
    ncu_kernels: int = Field(3, ge=1)
    """`ncu`: at most this many kernels, most device time first, stopping once they cover 80 %
    of the custom kernels' device time."""
    triton_aot: bool = True
    """On a machine without a GPU, also compile the Triton kernels a candidate launched for
    sm_90 (`evaluator.build.triton_aot`), after its correctness trials: the interpreter runs
    programs the GPU compiler rejects (a `tl.dot` of a 2-D and a 1-D block is `compile_error`
    with it, `tests/evaluator/test_triton_aot_cpu.py`). Off: the tests' CPU configs, where its
    compile time buys nothing they check."""
    cache_dir: Path = Field(default_factory=_default_cache_dir)
    """Baseline timings, extension builds, nvcc checks and inductor caches live under here
    (`private/`, harness-only when the harness is root; see `evaluator.procs.isolation.private_dir`)."""
    work_root: Path | None = None
    """Where the per-evaluation temporary directories go, inside its `kloop-work` directory
    (default: the system temp dir's), which children that run candidate code see holding only
    their own (`isolation.work_parent`)."""
    keep_workdir: bool = False
    """Keep the temporary directories for debugging (their paths are logged)."""
    output_tail_bytes: int = 65536
    """How much of a child's stdout and stderr is kept (the tail)."""
    sandbox_uid: int | None = 2_000_000_000
    """When the harness runs as root, run candidate code under a uid (and gid) of
    `sandbox_uid .. sandbox_uid + sandbox_uids - 1`, one per evaluation in flight on this host
    (`evaluator.procs.uidpool`), if it can reach the interpreter, kloop and the GPU; otherwise, or with
    None, under the harness's uid without capabilities (flagged `isolation_same_uid`). The
    default range is one no account should use: its uids own nothing outside kloop's dirs."""
    sandbox_uids: int = Field(32, ge=1)
    """How many sandbox uids (evaluations in flight per host; more wait for a free one)."""
    salt: str | None = None
    """Seed salt for the correctness inputs; None draws a fresh random one per evaluation
    (so a candidate cannot hard-code its inputs). Set it only to reproduce a run."""

    @model_validator(mode="before")
    @classmethod
    def _removed(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name in data:
                if name in REMOVED:
                    raise ValueError(f"{name} was removed on 2026-12-05 ({REMOVED[name]}); "
                                     "drop it: the evaluator always runs as its default did")
        return data

    @field_validator("policy")
    @classmethod
    def _known_policy(cls, v: str) -> str:
        get_policy(v)
        return v

    @field_validator("device")
    @classmethod
    def _device_form(cls, v: str) -> str:
        ok = v in ("auto", "cpu", "cuda") or (v.startswith("cuda:") and v[5:].isdigit())
        if not ok:
            raise ValueError(f"device must be auto, cpu, cuda or cuda:N, not {v!r}")
        return v

    def resolved_policy(self) -> Policy:
        return get_policy(self.policy)

    def comparison(self) -> Comparison:
        policy = self.resolved_policy()
        return Comparison(policy=policy.name, precision=self.precision,
                          tolerance=policy.tolerance(self.precision),
                          noisy_construction=policy.noisy_construction,
                          timing_of_record=policy.timing_of_record,
                          speedup_stat=policy.speedup_stat)
