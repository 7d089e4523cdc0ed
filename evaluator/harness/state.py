"""The state of one evaluation in the harness (`EvalRun`) and the helpers the stages share.

Candidate code only ever runs in child processes (`evaluator.procs.sandbox`); the harness never
imports it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import logging
import os
import re
import secrets
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from kloop.evaluator import __version__
from kloop.evaluator.build import triton_runtime
from kloop.evaluator.common import linux
from kloop.evaluator.common.config import EvalConfig, Policy
from kloop.evaluator.common.hostview import private_roots
from kloop.evaluator.common.protocol import Control, ProblemSpec, TimingSpec
from kloop.evaluator.common.result import (
    ErrorInfo,
    EvalResult,
    Stage,
    TimingPlan,
    TimingStats,
)
from kloop.evaluator.harness import cores
from kloop.evaluator.harness.baselines import best_of
from kloop.evaluator.harness.ledger import Ledger
from kloop.evaluator.harness.outcome import Decided, Flagged, Verdict
from kloop.evaluator.harness.reference import ReferenceOutput
from kloop.evaluator.procs import board, devicepool, isolation, uidpool
from kloop.evaluator.procs.devicelock import DeviceHold, HoldKind, device_lock
from kloop.evaluator.procs.forkserver import Confinement, gpu_nodes
from kloop.evaluator.procs.hostbytes import candidate_bytes
from kloop.evaluator.procs.isolation import SandboxPlan
from kloop.evaluator.procs.sandbox import Child, ChildOutcome, DiskLimit, child_env, visible_device
from kloop.problems.registry import Problem

if TYPE_CHECKING:
    from kloop.evaluator.harness.servers import BaselineServer

log = logging.getLogger(__name__)


@functools.lru_cache(maxsize=8)
def cuda_arch_list(device: str) -> str | None:
    """`TORCH_CUDA_ARCH_LIST` for `cuda:N` (e.g. `9.0`), read with nvidia-smi so that the
    harness never creates a CUDA context; None when unknown (torch then probes itself)."""
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return os.environ["TORCH_CUDA_ARCH_LIST"]
    index = device.split(":")[1] if ":" in device else "0"
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=compute_cap", "--format=csv,noheader", "-i", index],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return out or None


SpeedupClock = Literal["harness", "events_bounded"]
PARKED_LIMIT_S = 6 * 3600.0


def speedup_clock(policy: Policy, timing: TimingStats | None,
                  eager: TimingStats | None) -> SpeedupClock | None:
    """The policy's clock where the candidate and the eager baseline both have its numbers,
    else the trusted clock's: one clock is never divided by the other."""
    if timing is None or not timing.comparable:
        return None
    if policy.timing_of_record == "events_bounded" and timing.events and eager and eager.events:
        return "events_bounded"
    return "harness"


def speedup(timing: TimingStats | None, baseline: TimingStats | None,
            stat: Literal["median", "mean"], clock: SpeedupClock | None) -> float | None:
    """baseline / candidate in `stat`, on `clock`'s numbers (the trusted clock's for a
    baseline without bounded events, e.g. a compiled baseline cached before they existed)."""
    if timing is None or baseline is None or clock is None:
        return None
    if clock == "events_bounded" and timing.events and baseline.events:
        cand, base = getattr(timing.events, f"{stat}_ms"), getattr(baseline.events, f"{stat}_ms")
    else:
        cand, base = getattr(timing, f"{stat}_ms"), getattr(baseline, f"{stat}_ms")
    return base / cand if cand > 0 else None


def derive_seed(salt: str, purpose: str, index: int) -> int:
    digest = hashlib.sha256(f"{salt}:{purpose}:{index}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def gpu_lock_name(device: str) -> str:
    """The lock's name for `device` (`cuda`, `cuda:N`): the physical GPU's UUID where NVML
    tells it, else its name in `CUDA_VISIBLE_DEVICES`, so every process naming the same GPU,
    in whichever way, waits for the same lock."""
    if device == "cpu":
        return device
    from kloop.evaluator.harness import gpustate
    from kloop.evaluator.procs.sandbox import visible_device

    visible = visible_device(device)
    return "gpu_" + re.sub(r"[^A-Za-z0-9_.-]", "_", gpustate.uuid(visible) or visible)


@dataclass
class EvalRun:
    """One evaluation's resources: its problem, config, dirs, device claim, uid lease, children
    and the reference's outputs in memory. What its stages find is not kept here: each stage
    returns its findings (`evaluator.harness.ledger`), the pipeline keeps them in order, and
    the result is their fold (`result_of`)."""

    problem: Problem
    source: str
    config: EvalConfig
    policy: Policy
    device: str
    root: Path
    salt: str
    started_at: str
    reference: ReferenceOutput | None = None
    sandbox: SandboxPlan | None = None
    """How candidate code runs (uid, capabilities); see `evaluator.procs.isolation`."""
    contained: bool = False
    """Whether children that run candidate code can be contained (`isolation.work_parent`)."""
    lease: uidpool.Lease | None = None
    """This evaluation's sandbox uid, held until `cleanup` (evaluator.procs.uidpool)."""
    claim: devicepool.Claim | None = None
    """`device`, counted in flight until `cleanup` (evaluator.procs.devicepool)."""
    kept: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)
    """Children kept across stages (the parked reference worker), ended first at `cleanup`."""
    ref_child: Child | None = None
    """The reference worker while it is parked (`ReferenceJob.paired`): the candidate's timed
    calls are interleaved with its baselines' (`evaluator.harness.paired`)."""
    incumbent: str | None = None
    """The source timed against this candidate in the same rounds (`evaluator.harness.headtohead`)."""
    incumbent_child: Child | None = None
    """The incumbent's child while it waits to serve the rounds."""
    device_hold: DeviceHold | None = None
    """The candidate child's hold while it is not alone yet (`EvalConfig.candidate_hold`):
    `alone_for_timing` makes it alone before the timed calls."""
    held_throughout: bool = False
    """The caller holds the device lock for this evaluation's next children
    (`headtohead.one_hold`): `on_device` takes no hold of its own."""
    server: BaselineServer | None = None
    """The kept baseline worker its paired rounds use (`evaluator.harness.servers`), pinned from
    its reference stage to `cleanup`; None: its own reference worker serves them (parked)."""
    plan: TimingPlan | None = None
    """How many timed calls each side gets (`harness.budget`), set at the start of its
    reference stage; None before (and in a kept worker's or a baselines-only run)."""
    retried_alone: bool = False
    """The second run of an evaluation that ran out of device memory (`pipeline.device_half`):
    it uses no kept baseline worker."""

    @classmethod
    def create(cls, problem: Problem, source: str, config: EvalConfig) -> EvalRun:
        claim = devicepool.claim(config.device)  # first: it raises where there is no such device
        try:
            return cls._create(problem, source, config, claim)
        except BaseException:
            claim.release()
            raise

    @classmethod
    def _create(cls, problem: Problem, source: str, config: EvalConfig,
                claim: devicepool.Claim) -> EvalRun:
        device = claim.device
        isolation.allow_page_locked_outputs()  # before any child (or the template) starts
        parent, contained = isolation.work_parent(config.work_root)
        root = Path(tempfile.mkdtemp(prefix="kloop-eval-", dir=parent))
        for sub in ("cand", "ref", "compile", "triton", "inductor", "cache"):
            (root / sub).mkdir()
        if device != "cpu":  # Triton's runtime module, prebuilt: no gcc under the device lock
            triton_runtime.seed(config.cache_dir, root / "triton")
        lease = None
        if config.sandbox_uid is not None and isolation.can_change_uid():
            lease = uidpool.lease(config.sandbox_uid, config.sandbox_uids)
        plan = isolation.plan_sandbox(lease.uid if lease else None, device != "cpu",
                                      problem.path)
        if lease is not None and plan.uid is None:
            lease.release()
            lease = None
        if plan.uid is not None:
            # The sandbox uid may pass through the root to its own dirs, never into ref/.
            root.chmod(0o711)
            (root / "ref").chmod(0o700)
            isolation.give_to(plan, root / "triton", root / "inductor", root / "cache")
        return cls(
            problem=problem, source=source, config=config, policy=config.resolved_policy(),
            device=device, root=root, salt=config.salt or secrets.token_hex(16),
            started_at=datetime.now(timezone.utc).isoformat(), sandbox=plan, lease=lease,
            contained=contained, claim=claim,
        )

    # ---- helpers used by the stages ---------------------------------------------------------

    @property
    def on_cpu(self) -> bool:
        return self.device == "cpu"

    @property
    def child_device(self) -> str:
        return "cpu" if self.on_cpu else "cuda"

    @property
    def can_construct_ahead(self) -> bool:
        """Whether the harness can hide the device from a candidate child and give it back
        under the lock (`EvalConfig.construct_at`): uncovering its device nodes in its mount
        namespace and restoring SCHED_OTHER need a root harness with the capabilities for
        both (`isolation.can_grant`) and the template process."""
        return isolation.can_grant()

    def ahead_paths(self) -> list[str]:
        """What a candidate child built ahead must not open before the lock."""
        return gpu_nodes() + list(self.config.hidden_from_builds)

    def gpu_lock(self, kind: HoldKind = "exclusive"
                 ) -> contextlib.AbstractContextManager[DeviceHold]:
        """The device lock of this evaluation's GPU stages (`evaluator.procs.devicelock`), named after
        the physical GPU; its files live in the host's lock dir, whatever the cache dir, closed
        to candidate code (`isolation.host_lock_dir`). `kind`: as `devicelock.HoldKind` says."""
        from kloop.evaluator.procs.isolation import host_lock_dir

        return device_lock(gpu_lock_name(self.device), host_lock_dir(), kind)

    def alone_for_timing(self, ledger: Ledger) -> None:
        """Before the first timed call: this evaluation's candidate hold made alone (the
        shared holders beside its untimed start gone, no new one let in); the wait is clocked
        (`timing_alone_wait`). A no-op where the hold is alone already."""
        hold = self.device_hold
        if hold is not None and not hold.alone:
            ledger.clock("timing_alone_wait", hold.upgrade())

    @contextlib.contextmanager
    def on_device(self, ledger: Ledger, mode, job, workdir: Path, stages: list[str],
                  extra_env: dict[str, str] | None = None, serves: bool = False,
                  keep: bool = False, hold: HoldKind = "exclusive",
                  mask: list[Path] | None = None) -> Iterator[Child]:
        """A child that uses the device. Its start and imports run outside the device lock; the
        lock is taken when the child says it is ready (its time limits stand still meanwhile),
        and given back only once the child is gone: the device work of two children never
        overlaps where either is timed, and no process start holds the device. A candidate
        child built ahead (`CandidateJob.construct_ahead`) gets its device nodes and its CPU
        priority back once the lock is held (`Child.grant`); one that asked to be judged again,
        or could not be given them, never gets `go` (`child.retry`). Its times go to `ledger`.
        `keep`: the child outlives the block (in `kept`, ended at `cleanup` or by its caller)
        and the lock is given back at the block's end: a trusted worker that does no device
        work until the harness asks it to, under a later hold.
        `hold`: `shared`/`shared_trusted`, a trusted child none of whose work under this hold
        is timed (an outputs-only reference worker; a kept worker's start that compiles, `keep`,
        parked idle after); it keeps the cores it was started on, the serving cores being the
        timed holder's. `candidate`: shared with outputs-only workers until `alone_for_timing`
        (kept in `device_hold` meanwhile)."""
        shared = hold in ("shared", "shared_trusted")
        lock = contextlib.nullcontext() if self.held_throughout else self.gpu_lock(hold)
        with contextlib.ExitStack() as held:  # outside the child's block: kept till it is gone
            spawned = time.monotonic()
            made = self.spawn(ledger, mode, job, workdir, stages, extra_env, serves=serves,
                              mask=mask)
            scope = contextlib.nullcontext(self.kept.enter_context(made)) if keep else made
            with scope as child:
                if child.wait_ready() and child.retry is None:
                    t0 = time.monotonic()
                    ledger.clock(f"{mode}_start", t0 - spawned)
                    with child.paused(), board.phase("device_wait"):
                        got_hold = held.enter_context(lock)
                    if hold == "candidate" and isinstance(got_hold, DeviceHold):
                        self.device_hold = got_hold
                        held.callback(setattr, self, "device_hold", None)
                    held.enter_context(board.phase("device"))
                    got = time.monotonic()
                    ledger.clock("device_wait", got - t0)
                    # Unwound first (the child is gone, the lock still held): the time this
                    # child kept the device, start-up and exit included, beside its stages.
                    name = f"{mode}_{'shared' if shared else 'held'}"
                    if not self.held_throughout:  # else its caller's hold counts it
                        held.callback(lambda: ledger.clock(name, time.monotonic() - got))
                    if not shared:  # the lock holder's processes on the serving cores
                        quiet = cores.plan()
                        cores.place(child.proc.pid, quiet.serving if quiet else None)
                    if child.ahead and (why := child.grant()) is not None:
                        child.retry = f"the device could not be given to it: {why}"
                        child.kill("retry")
                    else:
                        child.send(Control(next="go"))
                yield child

    def problem_spec(self) -> ProblemSpec:
        p, meta = self.policy, self.problem.meta
        scale = shift = None
        from kloop.evaluator.harness.checks import is_degenerate, prefix_probed

        # The whole-sequence distribution first: it is also one under which the output
        # depends on the input (scripts/probe_prefix.py checks both).
        if prefix_probed(self):
            scale, shift = meta.prefix.strict_input_scale, meta.prefix.strict_input_shift
        elif (p.degenerate_trials and meta.degenerate_probe == "scaled_inputs"
              and is_degenerate(self)):
            scale, shift = meta.degenerate_input_scale, meta.degenerate_input_shift
        return ProblemSpec(
            path=str(self.problem.path), sha256=self.problem.sha256,
            overrides=self.config.problem_overrides, device=self.child_device,
            precision=self.config.precision, allow_tf32=p.allow_tf32,
            construction_seed=derive_seed(self.salt, "construction", 0)
            if p.noisy_construction else None,
            input_scale=scale, input_shift=shift,
        )

    def timing_spec(self, full: bool = False) -> TimingSpec:
        """How this evaluation times its calls: as many as its plan gives (`harness.budget`),
        or the full count before it has one, or when asked (`full`: what a kept worker's key
        and start use, the same for every evaluation of a problem)."""
        p, c = self.policy, self.config
        trials = c.cpu_timing_trials if self.on_cpu else p.timing_trials
        if self.plan is not None and not full:
            trials = self.plan.calls
        return TimingSpec(
            trials=trials,
            warmup_calls=c.cpu_warmup_calls if self.on_cpu else p.warmup_calls,
            warmup_ms=0.0 if self.on_cpu else p.warmup_ms,
            l2_flush=not self.on_cpu,
            l2_flusher=self.device if c.l2_flush == "trusted" else None,
            gpu=None if self.on_cpu else visible_device(self.device),
        )

    def spawn(self, ledger: Ledger, mode, job, workdir: Path, stages: list[str],
              extra_env: dict[str, str] | None = None, device: str | None = None,
              serves: bool = False, mask: list[Path] | None = None) -> Child:
        c = self.config
        timeouts = {"startup": c.timeouts.startup}
        if mode == "reference":  # it builds models and draws trial inputs before it is ready
            timeouts["startup"] += c.timeouts.reference
            # Parked (`ReferenceJob.paired`): it waits, off the device, for the candidate's
            # timed calls, however long the candidate's start and trials take; the harness
            # ends it (`harness.timed.release_reference`, `cleanup`).
            timeouts["paired"] = PARKED_LIMIT_S
        # A candidate child built ahead runs candidate code before the lock too.
        ahead = getattr(job, "construct_ahead", False)
        if ahead:
            timeouts["startup"] += c.timeouts.load
        timeouts.update({s: getattr(c.timeouts, s) for s in stages})
        extra = dict(extra_env or {})
        # Candidate code outside the device lock: idle CPU time only, and no GPU.
        outside = mode == "compile"
        if outside or ahead:
            extra[linux.BACKGROUND_ENV] = "1"
        if self.on_cpu:
            extra.setdefault("OMP_NUM_THREADS", str(c.cpu_threads))
        elif (threads := lock_holder_threads(mode)) is not None:
            extra.setdefault("OMP_NUM_THREADS", str(threads))
        env = child_env(workdir / "home", device or self.device, extra)
        rss = int(c.host_rss_limit_gb * (1 << 30))
        # Candidate code runs in the candidate and compile children (importing it builds).
        runs_candidate = mode in ("candidate", "compile")
        plan = self.sandbox if runs_candidate else None
        # The compile child runs candidate code outside the device lock: no GPU.
        hide = gpu_nodes() + list(c.hidden_from_builds) if outside else \
            list(getattr(job, "ahead_hidden", [])) if ahead else []
        # Contained (a root harness): only its own evaluation's dir is visible, and no process
        # outside its own PID namespace (the reference worker, the flusher, other evaluations).
        # A PID namespace leaves the GPU reachable: CUDA needs only the device nodes and
        # /proc/driver/nvidia, which the remounted /proc still shows.
        contain = self.contained and runs_candidate
        disk = DiskLimit(self.root, disk_limit(self)) if runs_candidate else None
        # Covered by an empty tmpfs: the reference worker's dir and the harness's private cache
        # for every child that runs candidate code, and the candidate child's dir for the one
        # that runs before it (compile: it must not rewrite the source the static rules judged,
        # or the trials' inputs). Modes keep a pool uid out of them, but not root without
        # capabilities or a non-root harness's own uid.
        # A harness that is not root contains through a user namespace. Everything but its
        # evaluation's dir (and the tests' drop boxes) is read-only to a contained child,
        # whatever its identity: a pool uid could otherwise write wherever modes let any uid
        # (a world-writable dir), and leave a note there for a later evaluation.
        userns = bool(contain or hide) and isolation.userns_works() and \
            (isolation.force_userns() or not isolation.can_change_uid())
        extra_mask, mask, writable = list(mask or []), [], []
        if contain:
            mask = [self.root / "ref", isolation.private_dir(c.cache_dir)]
            if mode != "candidate":
                mask.append(self.root / "cand")
            mask += extra_mask
            writable = list(c.child_writable)
        confine = Confinement(
            hide=hide, keep=str(self.root) if contain else None, own_pids=contain,
            mask=[str(p) for p in mask], userns=userns,
            readonly=contain,
            writable=[str(p) for p in writable],
            private=private_roots(str(Path.home())) if contain else [],
            needed=[str(self.problem.path)] if contain else [])
        child = Child(mode, job, workdir, env, timeouts, rss, c.output_tail_bytes, plan,
                      serves=serves, confine=confine, disk=disk,
                      on_uncontained=lambda: ledger.record(Flagged(flag="isolation_uncontained")),
                      ahead=ahead)
        quiet = cores.plan()
        if quiet is not None and (outside or ahead):  # off the timed cores until the lock
            child.cores = quiet.rest
        if plan is not None:
            isolation.give_to(plan, workdir)
            if plan.same_uid:
                ledger.record(Flagged(flag="isolation_same_uid"))
        return child

    @property
    def source_sha256(self) -> str:
        return hashlib.sha256(self.source.encode()).hexdigest()

    @property
    def writable_cache(self) -> Path:
        """The cache dir of this evaluation's children (`KLOOP_CACHE_DIR`), in its own dir and
        gone with it: no cache is writable by two evaluations, so nothing one candidate leaves
        there reaches another. Caches that outlive an evaluation are filed by trusted code
        only (`evaluator.build.buildstore`)."""
        return self.root / "cache"

    def cleanup(self) -> None:
        try:
            self.kept.close()  # the parked reference worker, if it is still there
            self.ref_child = None
            if self.server is not None:
                from kloop.evaluator.harness.servers import SERVERS

                server, self.server = self.server, None
                SERVERS.release(server)
            if self.config.keep_workdir:
                log.info("kept work dir %s", self.root)
            else:
                shutil.rmtree(self.root, ignore_errors=True)
        finally:
            if self.lease is not None:  # after its files are gone: the next holder starts clean
                self.lease.release()
                self.lease = None
            if self.claim is not None:
                self.claim.release()


def own_outputs(run: EvalRun) -> int:
    """Bytes a candidate's trial outputs may take in its dir at the problem's full size
    (`procs.hostbytes.candidate_bytes`); 0 at other sizes, where the meta's shape says nothing."""
    from kloop.evaluator.harness.judge import trial_kinds

    if run.config.problem_overrides:
        return 0
    return candidate_bytes(run.problem.meta.output_shape, len(trial_kinds(run)))


def disk_limit(run: EvalRun) -> int:
    """`disk_limit_gb` beyond what the candidate's own trial outputs legitimately take."""
    return int(run.config.disk_limit_gb * (1 << 30)) + own_outputs(run)


def child_failure(outcome: ChildOutcome, stage: Stage, config: EvalConfig) -> Decided:
    """The verdict on a child that ended without reporting: timeout, memory kill, signal or exit
    code."""
    tail = outcome.stderr_tail[-8000:] or None
    if outcome.killed_for == "timeout":
        return Decided(status="timeout", stage=stage, error=ErrorInfo(
            type="Timeout", stderr_tail=tail,
            message=f"stage {outcome.stage} ran past its limit of {outcome.stage_limit_s:g} s"))
    if outcome.killed_for == "memory":
        info = ErrorInfo(type="MemoryLimit", stderr_tail=tail, message=(
            f"host memory above {config.host_rss_limit_gb:g} GiB in stage "
            f"{outcome.stage}; the process was killed"))
    elif outcome.killed_for == "disk":
        info = ErrorInfo(type="DiskLimit", stderr_tail=tail, message=(
            f"more than {config.disk_limit_gb:g} GiB (or 200,000 files) beyond its trial "
            f"outputs written into its work dir in stage {outcome.stage}; the process was "
            "killed"))
    elif outcome.signal:
        info = ErrorInfo(type=outcome.signal, stderr_tail=tail, message=(
            f"process killed by {outcome.signal} ({-(outcome.returncode or 0)}) in stage "
            f"{outcome.stage}"))
    else:
        info = ErrorInfo(type="ProcessExit", stderr_tail=tail, message=(
            f"process exited with code {outcome.returncode} in stage {outcome.stage} "
            f"without reporting a result"))
    return Decided(status="runtime_error", stage=stage, error=info)


def result_of(run: EvalRun, v: Verdict) -> EvalResult:
    """The result of `run` whose findings fold to `v` (its status decided)."""
    assert v.status is not None
    vs = {"eager": run_speedup(run.policy, v, v.eager), "compile": run_speedup(run.policy, v, v.compiled),
          "compile_ro": run_speedup(run.policy, v, v.compiled_ro)}
    best = best_of(vs)
    return EvalResult(
        evaluator_version=__version__, status=v.status, stage_reached=v.stage,
        backend=v.backend, has_custom_kernel=v.has_custom_kernel,
        problem_id=run.problem.id, problem_sha256=run.problem.sha256,
        candidate_sha256=run.source_sha256,
        policy=run.policy.name, tolerance=run.policy.tolerance(run.config.precision),
        device=run.device,
        problem_overrides=run.config.problem_overrides, compile=v.compile,
        correctness=v.trials, timing=v.timing, eager=v.eager,
        compiled=v.compiled, compiled_ro=v.compiled_ro, speedup_vs_eager=vs["eager"],
        speedup_vs_compile=vs["compile"], speedup_vs_compile_ro=vs["compile_ro"],
        speedup_vs_best=best.speedup, best_baseline=best.name,
        speedup_clock=verdict_clock(run.policy, v),
        speedup_ci={b: i for b, i in v.speedup_ci.items() if vs.get(b) is not None},
        head_to_head=v.head_to_head if v.status == "correct" else None,
        paired=v.paired, precision_calls=v.precision_calls,
        profile=v.profile,
        precision=v.precision,
        violations=v.violations, flags=sorted(set(v.flags)), error=v.error,
        stage_seconds=v.stage_seconds, env=v.env, started_at=run.started_at,
    )


def run_speedup(policy: Policy, v: Verdict, baseline: TimingStats | None) -> float | None:
    """baseline / candidate on the policy's statistic and clock, for a `correct` verdict only."""
    if v.status != "correct":
        return None
    return speedup(v.timing, baseline, policy.speedup_stat, verdict_clock(policy, v))


def verdict_clock(policy: Policy, v: Verdict) -> SpeedupClock | None:
    return None if v.status != "correct" else speedup_clock(policy, v.timing, v.eager)


def lock_holder_threads(mode: str) -> int | None:
    """The intra-op CPU threads of the candidate child, which runs under the device lock: one
    per serving core it is moved to there (`harness.cores`), None where there is no such plan.
    torch's default is every core the process saw at import (16 on the H200 host): a team of 16
    on 2 cores, spinning at every barrier. With the default, a custom-kernel candidate's random
    trials took 2.1-4.6 s under the lock (the ghost trial 1.1-3.3 s; the H200, 653e30f and
    af624e7); with this, 0.26-1.76 s (the H200 at d08a5c8) and the ghost trial 0.05-0.23 s (the
    H100 at 177bcbe), 2026-12-06 (its verdict compares outputs on the CPU). The reference worker
    keeps the default: with one thread per serving core its stage took 0.5-1.1 s longer (its
    models' construction and inputs are CPU work), the H200 at d08a5c8 against 653e30f,
    2026-12-06. Compile children (no lock, the other cores) keep the default too."""
    if mode != "candidate":
        return None
    quiet = cores.plan()
    return len(quiet.serving) if quiet is not None else None
