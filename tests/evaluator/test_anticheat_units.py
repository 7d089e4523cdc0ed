"""The pieces of the runtime anti-cheat checks that need no child process: the reparam
model, the identity and flag baseline, the interleaved timing hook, the determinism rule,
path reachability for the sandbox uid."""

from __future__ import annotations

import functools
import shutil
import tempfile
import time
import types
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn as nn

from kloop.evaluator.build import buildcache
from kloop.evaluator.common.config import get_policy
from kloop.evaluator.common.protocol import ProblemSpec
from kloop.evaluator.harness.checks import determinism
from kloop.evaluator.procs import isolation
from kloop.evaluator.worker.construct import noisy_model
from kloop.evaluator.worker.probes import Baseline, ghost_extensions, record_extension_outputs

_SPEC = ProblemSpec(path="unused", sha256="0", overrides={}, device="cpu", precision="fp32",
                    allow_tf32=False)


class _Net(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.bn = nn.BatchNorm1d(width)
        self.attn = nn.MultiheadAttention(width, 2)  # imports nn.init.constant_ by name
        self.token = nn.Parameter(torch.zeros(1, width))  # constant, made outside nn.init


class _PackingNet(_Net):
    """Packs copies in __init__ and re-runs a redundant init, as honest candidates may."""

    def __init__(self, width: int = 8):
        super().__init__(width)
        nn.init.ones_(self.bn.weight)
        self.register_buffer("wt", self.fc.weight.detach().t().contiguous())
        self.register_buffer("affine", torch.stack([self.bn.weight, self.bn.bias]).detach())


def _build(cls, seed: int, tmp: Path, role: str) -> nn.Module:
    path = str(tmp / "fills.pt")
    if role == "reference":
        return noisy_model(cls, [], _SPEC, seed, fills_out=path)
    return noisy_model(cls, [], _SPEC, seed, fills_in=path)


def test_noisy_models_agree_and_copies_packed_in_init_stay_valid(tmp_path):
    a = _build(_Net, 7, tmp_path, "reference")
    b = _build(_PackingNet, 7, tmp_path, "candidate")
    for (name, pa), (_, pb) in zip(a.named_parameters(), b.named_parameters(), strict=True):
        assert torch.equal(pa, pb), name
    assert torch.equal(b.wt, b.fc.weight.t())
    assert torch.equal(b.affine, torch.stack([b.bn.weight, b.bn.bias]))
    # Every parameter differs from the seed-42 model's, the constants included (kernels that
    # assume BatchNorm's ones and zeros fail); buffers are untouched.
    torch.manual_seed(42)
    plain = _Net()
    for (name, pa), (_, pp) in zip(a.named_parameters(), plain.named_parameters(), strict=True):
        assert not torch.equal(pa, pp), name
    assert torch.equal(a.bn.running_mean, torch.zeros(8))
    assert torch.equal(a.bn.running_var, torch.ones(8))
    c = _build(_Net, 8, tmp_path, "reference")
    assert not torch.equal(a.fc.weight, c.fc.weight) and not torch.equal(a.bn.bias, c.bn.bias)
    # The init functions are restored afterwards.
    assert torch.equal(nn.init.zeros_(torch.empty(3)), torch.zeros(3))
    assert torch.equal(torch.nn.modules.activation.constant_(torch.empty(2), 0.0), torch.zeros(2))


class _OwnAffineNet(nn.Module):
    """An honest rewrite: other names, and BatchNorm's affine parameters made with torch.ones
    and torch.zeros instead of nn.BatchNorm1d (so no nn.init fill ever touches them)."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.gamma = nn.Parameter(torch.ones(width))
        self.beta = nn.Parameter(torch.zeros(width))
        self.attn = nn.MultiheadAttention(width, 2)
        self.cls = nn.Parameter(torch.zeros(1, width))


def test_parameters_made_outside_nn_init_get_the_reference_values_by_position(tmp_path):
    ref = _build(_Net, 11, tmp_path, "reference")
    cand = _build(_OwnAffineNet, 11, tmp_path, "candidate")
    pairs = [(ref.fc.weight, cand.proj.weight), (ref.fc.bias, cand.proj.bias),
             (ref.bn.weight, cand.gamma), (ref.bn.bias, cand.beta),
             (ref.attn.in_proj_weight, cand.attn.in_proj_weight),
             (ref.attn.in_proj_bias, cand.attn.in_proj_bias), (ref.token, cand.cls)]
    for r, c in pairs:
        assert torch.equal(r, c)
    # Nothing constant is left for a kernel to assume.
    assert not torch.equal(cand.gamma, torch.ones(8)) and not torch.equal(cand.beta, torch.zeros(8))


class _AssumesAffineNet(nn.Module):
    """Catalog C7 with renamed modules: no affine parameters at all (it assumes ones/zeros)."""

    def __init__(self, width: int = 8):
        super().__init__()
        self.proj = nn.Linear(width, width)
        self.attn = nn.MultiheadAttention(width, 2)
        self.cls = nn.Parameter(torch.zeros(1, width))


def test_a_model_that_assumes_the_affine_defaults_cannot_match(tmp_path):
    ref = _build(_Net, 5, tmp_path, "reference")
    cand = _build(_AssumesAffineNet, 5, tmp_path, "candidate")
    assert not torch.equal(ref.bn.weight, torch.ones(8))  # what it assumes is not there
    # Its own parameters still take the reference's values where they correspond.
    assert torch.equal(ref.fc.weight, cand.proj.weight)


def test_baseline_sees_replaced_timers_and_changed_backend_flags():
    base = Baseline.take()
    assert base.tampered() == [] and base.changed_flags() == []
    real_clock, real_flag = time.perf_counter, torch.backends.cudnn.benchmark
    try:
        time.perf_counter = lambda: 0.0
        torch.backends.cudnn.benchmark = not real_flag
        assert "time.perf_counter" in base.tampered()
        assert base.changed_flags() == [f"cudnn.benchmark: {real_flag!r} -> {not real_flag!r}"]
    finally:
        time.perf_counter, torch.backends.cudnn.benchmark = real_clock, real_flag
    assert base.tampered() == [] and base.changed_flags() == []


def _run(policy: str) -> SimpleNamespace:
    return SimpleNamespace(flags=[], violations=[], policy=get_policy(policy))


def test_determinism_flags_last_bit_noise_and_rejects_real_differences():
    first = [torch.linspace(0, 1, 64)]
    assert determinism(_run("strict"), first, [first[0].clone()], 1e-4) == []
    noisy = [first[0] + 1e-7]
    [v] = determinism(_run("strict"), first, noisy, 1e-4)
    assert (v.rule, v.severity) == ("nondeterministic", "flag")
    wrong = [first[0] + 1e-2]
    [v] = determinism(_run("strict"), first, wrong, 1e-4)
    assert (v.rule, v.severity) == ("nondeterministic", "reject")
    [v] = determinism(_run("kernelbench"), first, wrong, 1e-4)
    assert v.severity == "flag"


def test_reachability_for_the_sandbox_uid():
    top = Path(tempfile.mkdtemp())  # directly under the world-traversable temp dir
    open_dir = top / "open"
    open_dir.mkdir()
    (open_dir / "f").write_text("x")
    top.chmod(0o755)
    open_dir.chmod(0o755)
    assert isolation.reachable(open_dir / "f", 65534, 65534, 4) is None
    open_dir.chmod(0o700)
    assert isolation.reachable(open_dir / "f", 65534, 65534, 4) == str(open_dir)
    # Its owner is never stopped by its own mode bits.
    st = open_dir.stat()
    assert isolation.reachable(open_dir / "f", st.st_uid, st.st_gid, 4) is None
    shutil.rmtree(top)


def test_ghost_stubs_return_nan_laid_out_as_the_real_call_and_are_undone(monkeypatch):
    ext = types.ModuleType("fake_ext")

    def attention(qkv, n_head):  # the output is narrower than the first argument
        return qkv[..., : qkv.shape[-1] // 3] * 2

    ext.attention = attention
    monkeypatch.setattr(buildcache, "LOADED_MODULES", [ext])
    net = nn.Module()
    net.attn = ext.attention  # held by the instance, as `self.fn = ext.fn` does
    x = torch.randn(2, 4, 12)
    with record_extension_outputs():
        real = net.attn(x, 2)
    with ghost_extensions() as seen:
        ghost, other = net.attn(x, 2), ext.attention(torch.randn(3, 6), 2)
    assert seen.count == 2
    assert ghost.shape == real.shape == (2, 4, 4) and bool(ghost.isnan().all())
    assert other.shape == (3, 6)  # never seen: shaped like its first argument
    assert net.attn is attention and ext.attention is attention


class _Slotted:
    __slots__ = ("fn",)


def test_ghost_stubs_reach_the_function_wherever_the_candidate_keeps_it(monkeypatch):
    """A decorative extension call held outside the module and instance dicts (a list, a
    tuple, a closure, a partial, a default argument, a class attribute, a staticmethod, a slot,
    a dict of kernels) used to run for real in the ghost call; every one goes through the stub
    now, and each holds the real function again afterwards."""
    ext = types.ModuleType("fake_ext")

    def relu(x):
        return x.clamp_min(0)

    ext.relu = relu
    monkeypatch.setattr(buildcache, "LOADED_MODULES", [ext])

    def closure_over(fn):
        return lambda x: fn(x)

    def with_default(x, fn=ext.relu):
        return fn(x)

    def with_kw_default(x, *, fn=ext.relu):
        return fn(x)

    class Holder(nn.Module):
        at_class = ext.relu
        static = staticmethod(ext.relu)

        def __init__(self):
            super().__init__()
            self.in_list = [ext.relu]
            self.in_tuple = ((ext.relu, 1), 2)  # two tuples deep
            self.table = {"relu": ext.relu}
            self.partial = functools.partial(ext.relu)
            self.closure = closure_over(ext.relu)

    h = Holder()
    slotted = _Slotted()
    slotted.fn = ext.relu
    calls = [
        lambda x: h.in_list[0](x), lambda x: h.in_tuple[0][0](x), lambda x: h.table["relu"](x),
        h.partial, h.closure, with_default, with_kw_default, lambda x: Holder.at_class(x),
        lambda x: h.static(x), lambda x: slotted.fn(x),
    ]
    x = torch.randn(4)
    with ghost_extensions() as seen:
        outs = [c(x) for c in calls]
    assert seen.count == len(calls)
    assert all(bool(o.isnan().all()) for o in outs)
    assert [torch.equal(c(x), x.clamp_min(0)) for c in calls] == [True] * len(calls)
    assert (h.in_list[0], h.in_tuple[0][0], h.table["relu"], h.partial.func, slotted.fn,
            Holder.at_class, Holder.__dict__["static"].__func__) == (relu,) * 7
    assert with_default.__defaults__ == (relu,) and with_kw_default.__kwdefaults__ == {"fn": relu}


def test_ghost_check_is_inconclusive_when_other_inputs_give_the_same_output():
    from kloop.evaluator.worker.trials import _Ghost, _ghost_verdict

    out = [torch.linspace(0, 1, 16)]
    ghost = _Ghost([out[0].clone()], "3 kernel calls stubbed")
    # Another input gave another output: the unchanged ghost output means decorative kernels.
    decorative = _ghost_verdict(ghost, out, [out[0] + 1.0], 1e-4)
    assert decorative.conclusive and decorative.value == 1.0
    # A degenerate problem: the previous call's output is this one, and stale memory holding
    # it would look the same, so nothing is concluded.
    stale = _ghost_verdict(ghost, out, [out[0].clone()], 1e-4)
    assert not stale.conclusive and "degenerate" in stale.detail
    changed = _ghost_verdict(_Ghost([out[0] * 0], "stubbed"), out, [out[0].clone()], 1e-4)
    assert changed.conclusive and changed.value == 0.0


def test_the_served_draw_seeds_the_same_streams_as_manual_seed():
    from kloop.evaluator.worker.construct import seed_all

    torch.manual_seed(77)
    want = (torch.randn(5), torch.randint(0, 9, (5,)), torch.rand(3))
    torch.manual_seed(1)  # move the streams elsewhere first
    torch.randn(100)
    seed_all(77)
    got = (torch.randn(5), torch.randint(0, 9, (5,)), torch.rand(3))
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))


def test_a_ready_message_from_candidate_code_is_out_of_sequence():
    """The harness takes the child's `ready` before any candidate code is imported; one that
    comes later was written by candidate code (it would ask for the device lock again)."""
    from kloop.evaluator.common.protocol import ReadyMsg
    from kloop.evaluator.harness.judge import MessageOrder, _out_of_sequence

    assert "ready" in (_out_of_sequence(MessageOrder(), ReadyMsg(), None) or "")


def test_the_launch_hook_counts_only_the_candidates_kernels_and_leaves_other_hooks_alone():
    """The hook count that spares Triton candidates the profiler, against Triton's real hook
    object: launches (as the launcher reports them) of the candidate's kernels count, others
    (torch.compile's, say) do not; a hook the candidate set still runs; nothing is left behind."""
    import triton  # noqa: F401  (the probe looks for an imported Triton)
    from triton.compiler.compiler import LazyDict

    from kloop.evaluator.worker.probes import _launch_knobs, hooked_triton_launches

    knobs = _launch_knobs()
    assert knobs is not None
    theirs: list[str] = []

    def candidate_hook(md):
        theirs.append(md.data["name"])

    def fire(name: str) -> None:
        hook = knobs.launch_enter_hook
        if hook is not None:
            hook(LazyDict({"name": name}))

    chain = hasattr(knobs.launch_enter_hook, "add")
    saved = knobs.launch_enter_hook
    if chain:
        knobs.launch_enter_hook.add(candidate_hook)
    else:
        knobs.launch_enter_hook = candidate_hook
    try:
        with hooked_triton_launches({"linear_kernel", "relu_kernel"}) as seen:
            for name in ["linear_kernel", "triton_poi_fused_relu_0", "relu_kernel", "linear_kernel"]:
                fire(name)
        assert seen.count == 3
        assert theirs == ["linear_kernel", "triton_poi_fused_relu_0", "relu_kernel",
                          "linear_kernel"]
        fire("relu_kernel")  # after the block: the candidate's hook only
        assert seen.count == 3 and len(theirs) == 5
    finally:
        if chain:
            knobs.launch_enter_hook.remove(candidate_hook)
        else:
            knobs.launch_enter_hook = saved


def test_a_ghost_verdict_of_the_hook_count_is_dropped_when_the_profiler_saw_bypasses():
    from kloop.evaluator.worker.trials import _Ghost, _ghost_verdict, _rechecked

    out = [torch.linspace(0, 1, 16)]
    ghost = _Ghost([out[0].clone()], "2 kernel calls stubbed", recheck=lambda: 4)
    verdict = _ghost_verdict(ghost, out, [out[0] + 1.0], 1e-4)
    assert verdict.value == 1.0
    assert ghost.recheck is not None
    dropped = _rechecked(verdict, ghost.recheck())
    assert not dropped.conclusive and "4 launches" in dropped.detail
    assert _rechecked(verdict, 0) is verdict  # confirmed: the kernels were decorative


def test_a_launch_hook_the_candidate_calls_itself_is_no_launch(monkeypatch):
    """The cheapest attack on the hook count: a forward that launches nothing but calls
    Triton's launch hook with its kernel's name. No real launch went through Triton's JIT entry,
    so the count comes from the profiler (here a stand-in that launches nothing: 0)."""
    import triton  # noqa: F401  (the probe looks for an imported Triton)
    from triton.compiler.compiler import LazyDict

    from kloop.evaluator.worker import trials
    from kloop.evaluator.worker.probes import _launch_knobs

    knobs = _launch_knobs()
    assert knobs is not None
    profiled: list[set[str]] = []

    def profiler_count(call, names):
        profiled.append(names)
        return call(), 0

    monkeypatch.setattr(trials, "custom_launches", profiler_count)

    def fake_launch() -> str:
        knobs.launch_enter_hook(LazyDict({"name": "relu_kernel"}))
        return "out"

    loaded = trials.Loaded(module=types.ModuleType("c"), model=nn.Identity(),
                           kernel_names={"relu_kernel"})
    result, launches = trials._gpu_launches(loaded, SimpleNamespace(backend="triton"),
                                            fake_launch, fake_launch)
    assert (result, launches) == ("out", 0)
    assert profiled == [{"relu_kernel"}]
    # A CUDA source is always counted by the profiler.
    assert trials._gpu_launches(loaded, SimpleNamespace(backend="cuda"), fake_launch,
                                fake_launch) == ("out", 0)
    assert len(profiled) == 2


_TWO_KERNELS = '''
import triton
import triton.language as tl


@triton.jit
def named_kernel(X, N, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(X + i, tl.load(X + i, mask=i < N) + 1.0, mask=i < N)


@triton.jit
def other_kernel(X, N, BLOCK: tl.constexpr):
    i = tl.arange(0, BLOCK)
    tl.store(X + i, tl.load(X + i, mask=i < N) * 2.0, mask=i < N)
'''


def test_a_real_launch_of_another_kernel_and_a_faked_hook_are_no_launch_of_its_own(
        tmp_path, monkeypatch):
    """The next cheapest attack: launch some other Triton kernel for real (Triton's JIT entry
    sees a launch) and call the launch hook with the own kernel's name. The JIT-entry count
    takes only the candidate's own kernels, so the profiler decides (its stand-in: 0)."""
    import importlib.util

    from triton.compiler.compiler import LazyDict
    from triton.runtime.interpreter import InterpretedFunction

    from kloop.evaluator.worker import trials
    from kloop.evaluator.worker.probes import _launch_knobs, triton_launches

    path = tmp_path / "two_kernels.py"
    path.write_text(_TWO_KERNELS)
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # runs the kernels on CPU tensors
    spec = importlib.util.spec_from_file_location("two_kernels", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    named, other = mod.named_kernel, mod.other_kernel
    if not isinstance(named, InterpretedFunction):  # Triton read the variable at import
        named, other = InterpretedFunction(named.fn), InterpretedFunction(other.fn)
    x = torch.zeros(16)
    with triton_launches(names={"named_kernel"}) as own, triton_launches() as every:
        named[(1,)](x, 16, BLOCK=16)
        other[(1,)](x, 16, BLOCK=16)
        other[(1,)](x, 16, BLOCK=16)
    assert (own.count, every.count) == (1, 3)
    assert torch.equal(x, torch.full((16,), 4.0))

    profiled: list[set[str]] = []
    monkeypatch.setattr(trials, "custom_launches",
                        lambda call, names: (profiled.append(names), (call(), 0))[1])

    def attack() -> str:
        other[(1,)](x, 16, BLOCK=16)
        _launch_knobs().launch_enter_hook(LazyDict({"name": "named_kernel"}))
        return "out"

    loaded = trials.Loaded(module=mod, model=nn.Identity(), kernel_names={"named_kernel"})
    assert trials._gpu_launches(loaded, SimpleNamespace(backend="triton"), attack,
                                attack) == ("out", 0)
    assert profiled == [{"named_kernel"}]
