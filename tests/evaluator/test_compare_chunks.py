"""The harness's output checks, computed chunk by chunk, against their definitions computed on
the whole tensor at once: every field of the verdict the same, whatever the chunk boundaries.

Why chunked: the checks run on one CPU thread while the candidate holds the device; chunks
keep each pass in cache (bench/compare_speed.py prints the side-by-side times)."""

from __future__ import annotations

import math

import pytest
import torch

from kloop.evaluator.common import correctness
from kloop.evaluator.common.correctness import compare_outputs
from kloop.evaluator.harness import checks, precision

INF, NAN = float("inf"), float("nan")


def _by_definition(e: torch.Tensor, g: torch.Tensor, tol: float) -> dict:
    """The documented test on the whole tensor, element by element in Python terms."""
    wide = torch.float64 if e.dtype == torch.float64 else torch.float32
    ef, gf = e.to(wide).reshape(-1).tolist(), g.to(wide).reshape(-1).tolist()
    f32 = wide == torch.float32

    def r(x: float) -> float:  # the arithmetic of the widened dtype
        return float(torch.tensor(x, dtype=wide)) if f32 else x

    rows, abs_, rel_ = [], [], []
    t = r(tol)  # a Python scalar meets a tensor in the tensor's dtype
    for i, (a, b) in enumerate(zip(ef, gf, strict=True)):
        diff = 0.0 if math.isinf(a) and a == b else r(abs(r(b - a)))
        bound = r(r(t * abs(a)) + t)
        if math.isnan(a) or math.isnan(b):
            ok = False
        elif math.isinf(a) or math.isinf(b):
            ok = math.isinf(a) and a == b
        else:
            ok = diff <= bound
        if math.isfinite(diff):
            abs_.append(diff)
            if a != 0:
                rel_.append(r(diff / abs(a)))
        if not ok:
            excess = INF if math.isnan(diff) else r(diff - bound)
            rows.append((excess, i))
    rows.sort(key=lambda x: (not math.isnan(x[0]), 0.0 if math.isnan(x[0]) else -x[0], x[1]))
    return {"ok": not rows, "mismatch": len(rows), "max_abs": max(abs_, default=None),
            "max_rel": max(rel_, default=None), "worst": [i for _, i in rows[:5]],
            "nan": (sum(map(math.isnan, ef)), sum(map(math.isnan, gf))),
            "inf": (sum(map(math.isinf, ef)), sum(map(math.isinf, gf)))}


def _cases() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(3)
    e = torch.rand(13, 11, generator=gen) * 4 - 2
    close = e + 1e-6 * torch.randn(13, 11, generator=gen)
    wrong = close.clone()
    wrong.view(-1)[[3, 40, 41, 100, 142]] += torch.tensor([0.5, -3.0, 0.5, 7.0, 1.0])
    wrong.view(-1)[[7, 90]] = torch.tensor([0.5, -3.0]) + e.view(-1)[[7, 90]]  # ties
    special_e = e.clone().view(-1)
    special_g = close.clone().view(-1)
    special_e[[0, 5, 9, 20, 33, 60]] = torch.tensor([INF, -INF, NAN, 0.0, INF, 3e38])
    special_g[[0, 5, 9, 20, 33, 60, 61]] = torch.tensor([INF, 4.0, NAN, 1e-3, -INF, -3e38, NAN])
    return {
        "close": (e, close),
        "wrong with ties": (e, wrong),
        "nan, inf, zeros, overflow": (special_e.view(13, 11), special_g.view(13, 11)),
        "float64": (e.double(), wrong.double()),
        "int": (torch.arange(30).reshape(5, 6), torch.arange(30).reshape(5, 6) * 2),
        "scalar": (torch.tensor(1.0), torch.tensor(1.5)),
        "empty": (torch.empty(0, 3), torch.empty(0, 3)),
    }


@pytest.mark.parametrize("chunk", [1, 7, 64, correctness.CHUNK])
@pytest.mark.parametrize("case", list(_cases()))
def test_the_chunked_test_decides_as_the_definition_does(monkeypatch, case, chunk):
    monkeypatch.setattr(correctness, "CHUNK", chunk)
    e, g = _cases()[case]
    [d] = compare_outputs([e], [g], ["torch.Tensor"], 1e-4)
    want = _by_definition(e, g, 1e-4)
    n = e.numel()
    assert d.ok == want["ok"]
    assert d.mismatch_fraction == (want["mismatch"] / n if n else 0.0)
    assert (d.max_abs_err, d.max_rel_err) == (want["max_abs"], want["max_rel"])
    assert (d.nan_expected, d.nan_got) == want["nan"]
    assert (d.inf_expected, d.inf_got) == want["inf"]
    flat = [sum(i * s for i, s in zip(w.index, e.stride(), strict=True)) for w in d.worst]
    assert flat == want["worst"]
    for w, i in zip(d.worst, flat, strict=True):
        assert math.isclose(w.got, float(g.reshape(-1)[i]), rel_tol=0, abs_tol=0) or \
            (math.isnan(w.got) and math.isnan(float(g.reshape(-1)[i])))
    if case == "wrong with ties":  # the test sees every kind of ranking it must make
        assert len(d.worst) == 5 and not d.ok


@pytest.mark.parametrize("chunk", [5, correctness.CHUNK])
def test_the_relative_rms_error_is_the_whole_tensors(monkeypatch, chunk):
    monkeypatch.setattr(precision, "CHUNK", chunk)
    gen = torch.Generator().manual_seed(5)
    r = torch.randn(17, 9, generator=gen, dtype=torch.float64)
    x = (r + 1e-6 * torch.randn(17, 9, generator=gen, dtype=torch.float64)).float()
    want = float((x.double() - r).norm() / r.norm())
    assert precision.relative_rms(x, r) == pytest.approx(want, rel=1e-12)
    for bad in (NAN, INF):
        y = x.clone()
        y.view(-1)[100] = bad
        assert precision.relative_rms(y, r) is None
        q = r.clone()
        q.view(-1)[3] = bad
        assert precision.relative_rms(x, q) is None
    assert precision.relative_rms(x, torch.zeros_like(r)) is None


@pytest.mark.parametrize("chunk", [3, correctness.CHUNK])
def test_bitwise_equality_matches_nan_with_nan_and_nothing_else(monkeypatch, chunk):
    monkeypatch.setattr(checks, "CHUNK", chunk)
    x = torch.rand(50)
    assert checks._bitwise_equal([x], [x.clone()])
    y, z = x.clone(), x.clone()
    y[[4, 31]] = z[[4, 31]] = NAN
    assert checks._bitwise_equal([y], [z])
    z[31] = 1.0
    assert not checks._bitwise_equal([y], [z])
    last_bit = x.clone()
    last_bit[47] = torch.nextafter(x[47], torch.tensor(2.0))
    assert not checks._bitwise_equal([x], [last_bit])
    assert checks._bitwise_equal([torch.tensor(0.0)], [torch.tensor(-0.0)])  # as `==` says
