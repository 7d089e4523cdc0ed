"""The pieces of the runtime anti-cheat checks that need no child process: the reparam
model, the identity and flag baseline, the interleaved timing hook, the determinism rule,
path reachability for the sandbox uid."""

from __future__ import annotations

import shutil
import tempfile
import time
import types
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.nn as nn

from evaluator import buildcache, isolation
from evaluator.checks import determinism
from evaluator.config import get_policy
from evaluator.construct import parameter_layout, reparam_model
from evaluator.probes import Baseline, ghost_extensions, record_extension_outputs
from evaluator.protocol import ProblemSpec
from evaluator.timing import time_callable

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


def test_reparam_models_agree_and_copies_packed_in_init_stay_valid():
    layout = parameter_layout(_Net())
    a = reparam_model(_Net, [], _SPEC, 7)
    b = reparam_model(_PackingNet, [], _SPEC, 7)
    assert parameter_layout(a) == parameter_layout(b) == layout
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
    c = reparam_model(_Net, [], _SPEC, 8)
    assert not torch.equal(a.fc.weight, c.fc.weight) and not torch.equal(a.bn.bias, c.bn.bias)
    # The init functions are restored afterwards.
    assert torch.equal(nn.init.zeros_(torch.empty(3)), torch.zeros(3))
    assert torch.equal(torch.nn.modules.activation.constant_(torch.empty(2), 0.0), torch.zeros(2))


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


def test_interleaved_check_runs_once_halfway_on_the_previous_calls_inputs():
    seen: list[str] = []
    sets = [[torch.zeros(1)], [torch.ones(1)], [torch.full((1,), 2.0)]]
    calls: list[float] = []
    time_callable(lambda x: calls.append(float(x)), sets, device="cpu", trials=6,
                  warmup_calls=0, warmup_ms=0.0, l2_flush=False,
                  between=lambda last: seen.append(f"{len(calls)}:{float(last[0])}"))
    # Timed calls use sets 0,1,2,0,1,2; the check comes after the third, on set 2's tensors.
    assert seen == ["3:2.0"] and calls == [0.0, 1.0, 2.0, 0.0, 1.0, 2.0]


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
    holders = [vars(net)]
    x = torch.randn(2, 4, 12)
    with record_extension_outputs(holders):
        real = net.attn(x, 2)
    with ghost_extensions(holders) as seen:
        ghost, other = net.attn(x, 2), ext.attention(torch.randn(3, 6), 2)
    assert seen.count == 2
    assert ghost.shape == real.shape == (2, 4, 4) and bool(ghost.isnan().all())
    assert other.shape == (3, 6)  # never seen: shaped like its first argument
    assert net.attn is attention and ext.attention is attention


def test_a_high_sync_gap_ratio_is_measured_again_and_the_smallest_kept(monkeypatch):
    from evaluator import timing

    rounds = iter([2.4, 1.1, 9.0])
    monkeypatch.setattr(timing, "_sync_gap_once", lambda fn, sets, trials: next(rounds))
    assert timing.sync_gap_ratio(None, [[]]) == 1.1  # contention once: not flagged
    rounds = iter([3.0, 2.0, 2.5])
    assert timing.sync_gap_ratio(None, [[]]) == 2.0  # hidden work every time: flagged
    rounds = iter([1.2])
    assert timing.sync_gap_ratio(None, [[]]) == 1.2  # below the bound: measured once


def test_ghost_check_is_inconclusive_when_other_inputs_give_the_same_output():
    from evaluator.trials import _Ghost, _ghost_verdict

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
