"""The precision check on large outputs, at secret positions (`evaluator.common.sample`): the
same positions in the reference worker and the harness, the same verdict as on every element,
and the attacks on precision still caught when every output is sampled."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from kloop.evaluator.common.config import POLICIES, EvalConfig, StageTimeouts
from kloop.evaluator.common.protocol import Sample
from kloop.evaluator.common.sample import Float64Outputs, positions, reduce
from kloop.evaluator.harness import precision

EXPLOITS = Path(__file__).parents[1] / "exploits"
SAMPLE = Sample(seed=1234, above=100, size=4096)


def test_positions_come_from_the_seed_alone_and_cover_the_output():
    a, b = positions(7, 10_000, 500), positions(7, 10_000, 500)
    assert torch.equal(a, b) and not torch.equal(a, positions(8, 10_000, 500))
    assert int(a.min()) >= 0 and int(a.max()) < 10_000


def test_only_large_floating_outputs_are_sampled_and_the_fp32_side_is_paired_alike():
    big, small, ints = torch.randn(50, 40, dtype=torch.float64), torch.randn(10), \
        torch.arange(500)
    kept, meta = reduce(SAMPLE, [big, small, ints])
    assert meta == {"sampled": [True, False, False], "numels": [2000, 10, 500]}
    assert kept[0].shape == (SAMPLE.size,) and kept[1] is small and kept[2] is ints
    f64 = Float64Outputs.load({"outputs": kept, **meta}, SAMPLE)
    # The fp32 output is taken at the float64 output's positions: the same elements.
    assert torch.equal(f64.pair(0, big.float()).double(), kept[0].float().double())
    assert f64.pair(1, small) is small
    other = torch.randn(51, 40)  # another element count: left as it is (shapes then differ)
    assert f64.pair(0, other) is other
    with pytest.raises(ValueError):
        Float64Outputs.load({"outputs": kept, **meta}, None)


@pytest.mark.parametrize("lowered", [None, torch.float16, torch.bfloat16])
def test_a_sample_gives_the_verdict_every_element_gives(lowered):
    gen = torch.Generator().manual_seed(0)
    r64 = torch.randn(400, 500, generator=gen, dtype=torch.float64)
    ref32 = r64.float()
    cand = ref32 if lowered is None else ref32.to(lowered).float()
    whole = {"outputs": [r64], "sampled": [False], "numels": [r64.numel()]}
    kept, meta = reduce(SAMPLE, [r64])
    f_whole = Float64Outputs.load(whole, None)
    f_kept = Float64Outputs.load({"outputs": kept, **meta}, SAMPLE)
    for f in (f_whole, f_kept):
        cand_err, ref_err = precision._worst([cand], f), precision._worst([ref32], f)
        assert cand_err is not None and ref_err is not None
    e_whole = precision._worst([cand], f_whole)
    e_kept = precision._worst([cand], f_kept)
    assert e_kept == pytest.approx(e_whole, rel=0.05)
    over = e_kept > 100 * max(precision._worst([ref32], f_kept), precision.FLOOR)
    assert over == (lowered is not None)


@pytest.fixture
def sample_everything(monkeypatch):
    """`strict` with every output of more than one element kept at 16 positions."""
    monkeypatch.setitem(POLICIES, "sample_all", POLICIES["strict"].model_copy(
        update={"name": "sample_all", "precision_sample_above": 1, "precision_sample": 16}))


def _config(tmp_path: Path, device: str) -> EvalConfig:
    return EvalConfig(device=device, cache_dir=tmp_path / "cache", policy="sample_all",
                      baselines="eager", kept_baselines=0, triton_aot=False, profile=False,
                      problem_overrides=_lenet(),
                      timeouts=StageTimeouts(startup=180, load=120, correctness=60, timing=120,
                                             profile=120, compile=300, reference=180,
                                             baselines=300))


def _lenet() -> dict:
    sys.path.insert(0, str(EXPLOITS))
    from exploit_cases import LENET_TINY
    return LENET_TINY


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", ["k05_half_precision_output.py",
                                  "k05b_half_precision_some_elements.py",
                                  "k10_fp32_probes_low_precision_timed.py"])
def test_lowered_precision_is_caught_on_sampled_outputs(tmp_path, sample_everything, name, device):
    from kloop.evaluator.harness.pipeline import evaluate

    r = evaluate("L3/4", (EXPLOITS / "candidates" / name).read_text(), _config(tmp_path, device))
    assert r.status in ("rejected", "incorrect"), (r.status, r.error, r.flags)
    assert any(v.rule == "precision_below_fp32" for v in r.violations), r.violations
    checks = [r.precision] if r.precision is not None else []
    assert all(c.positions == 16 for c in checks)


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_an_honest_kernel_passes_the_sampled_check(tmp_path, sample_everything, device):
    from kloop.evaluator.harness.pipeline import evaluate

    src = (EXPLOITS / "honest" / "h20_lenet_packed_fc_weights.py").read_text()
    r = evaluate("L3/4", src, _config(tmp_path, device))
    assert r.status == "correct", (r.status, r.error, r.flags, r.violations)
    assert r.precision is not None and r.precision.ok and r.precision.positions == 16
