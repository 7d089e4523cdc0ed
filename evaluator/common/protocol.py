"""What the harness and its child processes say to each other.

The harness writes a job (JSON file) for each child; the child answers with one JSON message
per line on a dedicated pipe (never stdout, which candidate code may print to), and the harness
answers the candidate child's `await` on its stdin. Every message is a typed record parsed with
pydantic; a line that does not parse is ignored and counted, never trusted.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

from kloop.evaluator.common.result import (
    Backend,
    CompileLog,
    EnvInfo,
    ErrorInfo,
    ProfileSummary,
    TimingStats,
)

ChildMode = Literal["reference", "candidate", "compile"]


class _Rec(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TimingSpec(_Rec):
    """How the harness times served calls (`evaluator.harness.served`). The seeds of the timed
    calls never appear here: they travel one by one with the calls."""

    trials: int
    warmup_calls: int
    warmup_ms: float
    l2_flush: bool = True
    gpu: str | None = None
    """The device as `CUDA_VISIBLE_DEVICES` names it, for the harness's NVML readings around
    the timed calls (None on CPU)."""
    l2_flusher: str | None = None
    """`l2_flush: trusted`: the harness's device (`cpu`, `cuda:N`) whose trusted flusher
    (`evaluator.harness.flusher`) flushes before each call; None: only the serving process's
    own `prep` does."""


class ProblemSpec(_Rec):
    """The reference problem as both children build it."""

    path: str
    sha256: str
    overrides: dict[str, Any] = Field(default_factory=dict)
    device: Literal["cpu", "cuda"]
    precision: Literal["fp32", "fp16", "bf16"]
    allow_tf32: bool | None
    construction_seed: int | None = None
    """None: the KernelBench way (seed 42, PyTorch's own initialisation). A seed: every model of
    the evaluation (reference and candidate, first and reparam) is built under its own secret
    seed with `torch.nn.init`'s constant fills made noisy (`construct.noisy_model`), so no build
    of the model can be told from another and no initial value can be assumed."""
    input_scale: float | None = None
    """Every floating input x of every call becomes `input_scale * x + input_shift` (a
    degenerate problem under a policy that probes it: the output then depends on the input at
    the tolerance, for every call, so a probe cannot be told from a timed call)."""
    input_shift: float | None = None


class Sample(_Rec):
    """Where float64 outputs are kept for the precision check when they are large
    (`evaluator.common.sample`): output k of more than `above` elements at `size` positions
    drawn from `seed + k`. Secret: only the trusted reference worker and the harness see it."""

    seed: int
    above: int
    size: int


class RefTrial(_Rec):
    index: int
    kind: str
    input_seed: int
    forward_seed: int
    inputs_path: str
    """Written into the candidate's work dir: the only thing the candidate gets."""
    expected_path: str
    """Written into the harness-private dir: the candidate never sees it."""
    perturb_seed: int | None = None
    """Run this trial on a second model built under this construction seed (the `reparam`
    trial: weights kept from an earlier build, assumed weights, constants)."""
    fills_path: str | None = None
    """With `perturb_seed`: where the reference's constant-filled parameters are written for the
    candidate (`construct.noisy_model`)."""
    fp64_path: str | None = None
    """Also compute this trial's output in float64 (harness-private; the precision check)."""
    fp64_sample: Sample | None = None
    """Large float64 outputs kept at these secret positions only."""


ROLES = {"eager": 0, "compile": 1, "compile_ro": 2}
"""The reference worker's served roles and the number a request names each by
(`evaluator.worker.serve.REQUEST`)."""


class Served64(_Rec):
    """A timed call whose output is also computed in float64 (the precision check on timed
    calls): its index among the timed calls, its secret seed, where the reference worker writes
    the float64 output and the fp32 reference's own error (harness-private)."""

    index: int
    seed: int
    path: str
    sample: Sample | None = None
    """Large float64 outputs kept at these secret positions only (and the reference's own error
    measured there)."""


class ReferenceJob(_Rec):
    problem: ProblemSpec
    trials: list[RefTrial]
    fills_path: str | None = None
    """Strict construction: where to write the main model's constant fills for the candidate."""
    baselines: list[Literal["eager", "compile", "compile_ro"]]
    timing: TimingSpec | None
    served64: list[Served64] = Field(default_factory=list)
    paired: bool = False
    """After its roles, say stage `paired` and serve every role on demand until `stop`: the
    harness interleaves these calls with the candidate's (`evaluator.harness.paired`)."""
    keep_serving: bool = False
    """Paired and kept between evaluations (`evaluator.harness.servers`): after each `stop` of
    its calls it says stage `paired` again and waits for `serve` (another evaluation's rounds)
    or `stop` (its end)."""

    def roles(self) -> list[str]:
        """What the worker serves, in this order, one session each on one call channel: eager
        always (its outputs are what the candidate's timed calls are checked against), then
        each compiled baseline asked for."""
        return ["eager"] + [r for r in ("compile", "compile_ro") if r in self.baselines]


class CandTrial(_Rec):
    index: int
    kind: str
    forward_seed: int
    inputs_path: str
    output_path: str
    perturb_seed: int | None = None
    """Run this trial on a second ModelNew built like the reference's (see RefTrial)."""
    fills_path: str | None = None
    repeat_output_path: str | None = None
    """Call again on the same inputs and save that output here (determinism check)."""
    count_launches: bool = False
    """Count the candidate's own kernel launches during the call (no_custom_kernel check)."""
    ghost: bool = False
    """First call once with the candidate's kernels replaced by no-ops (ghost-kernel check)."""


class CandidateJob(_Rec):
    problem: ProblemSpec
    candidate_path: str
    backend: Backend
    trials: list[CandTrial]
    timing: TimingSpec | None
    fills_path: str | None = None
    """The main model's constant fills from the reference (strict construction)."""
    profile: bool
    ncu: bool
    profile_trials: bool = False
    """`EvalConfig.profile_trials`: each probe trial under cProfile, reported as a flag."""
    memory_limit_bytes: int | None
    cpu_emulation: bool
    triton_aot: bool = False
    """Under the interpreter: compile the launched Triton kernels for sm_90 too."""
    build_dir: str | None = None
    tolerance: float = 1e-4
    """The policy's tolerance at this precision (the ghost check compares at it)."""
    construct_ahead: bool = False
    """Import the candidate and build its models on CPU before reporting ready
    (`EvalConfig.construct_at`): the harness has hidden `ahead_hidden` (the GPU's device nodes)
    from this process and put it at SCHED_IDLE until it holds the device lock for it."""
    ahead_hidden: list[str] = []
    """What must be hidden (each path /dev/null) for the work before the lock to start; if any
    is not, the child waits for the lock first, as without `construct_ahead`."""


class CompileJob(_Rec):
    candidate_path: str
    backend: Backend
    device: Literal["cpu", "cuda"]
    """cpu: nothing can run here, compile-check CUDA sources with nvcc instead of building."""
    build_dir: str


# ---- messages, child -> harness -------------------------------------------------------------


class StageMsg(_Rec):
    kind: Literal["stage"] = "stage"
    stage: str


class ErrorMsg(_Rec):
    kind: Literal["error"] = "error"
    stage: str
    status: Literal["compile_error", "runtime_error"]
    error: ErrorInfo


class TrialMsg(_Rec):
    kind: Literal["trial"] = "trial"
    index: int
    output_types: list[str]
    """Python type of each returned object (`torch.Tensor` for plain tensors)."""
    mutated_inputs: list[int] = Field(default_factory=list)
    """Indices of input tensors the call wrote into."""
    threads_grew: int = 0
    """Threads of the process started during the call and still alive when it returned."""
    deferred: bool = False
    """The output changed between the call's return and a full device synchronisation."""


ProbeName = Literal["identity", "backend_flags", "threads", "launches", "ghost",
                    "l2_persistence"]


class ServeMsg(_Rec):
    """A worker is ready to serve calls of `role` (the harness answers `serve` with the layout
    of the shared output memory, or `skip`); `outputs` are the reference's (shape, dtype)."""

    kind: Literal["serve"] = "serve"
    role: Literal["eager", "compile", "compile_ro", "candidate"]
    outputs: list[tuple[list[int], str]] = Field(default_factory=list)


class CallProblemMsg(_Rec):
    """Why a served call's output could not be served (wrong type, shape or dtype)."""

    kind: Literal["call_problem"] = "call_problem"
    message: str


class ProbeMsg(_Rec):
    """What an anti-cheat probe in the candidate process saw; `evaluator.harness.checks` judges it."""

    kind: Literal["probe"] = "probe"
    probe: ProbeName
    names: list[str] = Field(default_factory=list)
    """What changed: tampered functions, changed backend flags (`name: before -> after`)."""
    value: float | None = None
    """A count (launches, extra threads) or a ratio (side_stream); None when not measurable."""
    conclusive: bool = True
    """False when the probe could not decide (e.g. the ghost forward raised)."""
    detail: str = ""




class AwaitMsg(_Rec):
    kind: Literal["await"] = "await"


class ReadyMsg(_Rec):
    """The child's first message: started and imported, not yet on the device. It touches the
    device only after the harness answers `go` (holding the device lock by then)."""

    kind: Literal["ready"] = "ready"
    ahead: bool = False
    """A candidate child (`CandidateJob.construct_ahead`): it imported the candidate and built
    its models on CPU before saying ready. False from a child started to build ahead: its
    trusted start found it was not kept from the device, so it builds under the lock (the
    harness flags `construct_before_lock_unavailable`; a false claim gains nothing: the child
    gets `go` only under the lock either way)."""
    retry: str | None = None
    """A candidate child whose work before the lock failed: why. It leaves without using the
    device, and the harness judges the candidate again the usual way, in a new child."""


class RetryMsg(_Rec):
    """A candidate child built ahead (`CandidateJob.construct_ahead`) found, once the device was
    its, that its process cannot use it (a CUDA call made before the lock, when the device
    was hidden, leaves that in the process). It leaves; nothing of it was judged."""

    kind: Literal["retry"] = "retry"
    reason: str


class TimingMsg(_Rec):
    kind: Literal["timing"] = "timing"
    name: Literal["candidate", "eager", "compile"]
    stats: TimingStats
    cached: bool = False


class ProfileMsg(_Rec):
    kind: Literal["profile"] = "profile"
    summary: ProfileSummary


class CompileMsg(_Rec):
    kind: Literal["compile"] = "compile"
    log: CompileLog


class EnvMsg(_Rec):
    kind: Literal["env"] = "env"
    env: EnvInfo


class FlagMsg(_Rec):
    kind: Literal["flag"] = "flag"
    flag: str


class DoneMsg(_Rec):
    kind: Literal["done"] = "done"


ChildMessage = Annotated[
    StageMsg | ErrorMsg | TrialMsg | ProbeMsg | AwaitMsg | TimingMsg | ProfileMsg
    | CompileMsg | EnvMsg | FlagMsg | DoneMsg | ServeMsg | CallProblemMsg | ReadyMsg | RetryMsg,
    Field(discriminator="kind"),
]
MESSAGE = TypeAdapter(ChildMessage)


class Control(_Rec):
    """Harness -> child: after `ready`, `go` or `stop`; after `await`, `serve` (with the output
    layout, JSON, in `data`) or `stop`; after a reference's `serve` message, `serve` or `skip`."""

    next: Literal["go", "stop", "serve", "skip"]
    data: str | None = None


# ---- the template process (`evaluator.worker.zygote`) ------------------------------------


class ForkRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    argv: list[str]
    """`evaluator.worker.child.main`'s argv (argv[0] is a name only)."""
    env: dict[str, str]
    cwd: str
    fd_targets: list[int]
    """Where each attached fd goes in the child: 0, 1, 2, then the passed fds' numbers."""
    uid: int | None = None
    gid: int | None = None
    hide: list[str] = []
    """Paths the child must not open (the GPU's device nodes, for a compile child that runs
    candidate code outside the device lock): /dev/null is bind-mounted over each, in a mount
    namespace of the child's own. Needs CAP_SYS_ADMIN (a root harness); without it the child
    starts anyway and says so on stderr."""
    keep: str | None = None
    """Contain the child (a root harness): in its mount namespace the directory that holds
    every evaluation's work dir is an empty tmpfs with only this one (the child's own
    evaluation's) bound back, so no other evaluation's files can be seen, let alone changed."""
    own_pids: bool = False
    """Also a PID namespace of its own, with /proc remounted: it can neither see nor signal
    any process outside it (children that never use the GPU), and when it exits everything it
    started is killed."""
    mask: list[str] = []
    """Directories covered by an empty tmpfs in the child's mount namespace (the reference
    worker's dir, the harness's private cache): where the child runs under the harness's own
    uid or as root without capabilities, file modes alone do not keep it out of them."""
    userns: bool = False
    """Enter a user namespace first (a harness that is not root): the namespaces above then
    need no privilege. The child is root only inside it and drops those capabilities before
    any candidate code runs."""
    readonly: bool = False
    """With `keep`: the whole tree read-only for the child but `keep`, /dev/shm and `writable`
    (`_readonly_but`), for a child that acts as an identity owning files outside its
    evaluation (root without capabilities, or the harness's own uid in a user namespace)."""
    writable: list[str] = []
    """With `readonly`: directories besides `keep` that stay writable (the tests' drop boxes)."""
    private: list[str] = []
    """With `keep`: directories the child must not look into (home directories, shared
    scratch, the host's logs and secrets): each becomes a read-only tmpfs that shows only the
    way to what the child needs (`needed`, its environment's paths, the interpreter and its
    libraries, its own evaluation's dir), bound back. And whatever under /etc others may not
    read (/etc/shadow, sudoers, ssh host keys) is covered: modes alone do not keep out a child
    that acts as their owner (root without capabilities)."""
    needed: list[str] = []
    """Paths the child must still reach inside `private` directories, besides those it names
    in its environment and its `sys.path` (the problem's file)."""


class GrantRequest(BaseModel):
    """Give a child forked with `hide` those paths back (the harness holds the device lock for
    it now): the covering mounts are detached in the child's mount namespace, from outside it,
    since the child holds no capability to do it itself. Needs CAP_SYS_ADMIN (a root harness)."""

    model_config = ConfigDict(extra="forbid")

    grant: int
    """The child's pid (unreaped, so it cannot have been reused)."""
    paths: list[str]
