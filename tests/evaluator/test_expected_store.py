"""The timed calls' quick test (`ExpectedStore.passes`) answers exactly as the full comparison
(`evaluator.common.correctness`) does, on values chosen to sit where the two could part: NaN, equal and
opposite infinities, overflow in the difference, elements exactly at the bound, half and double
precision, integer outputs, no tolerance, sampled outputs."""

from __future__ import annotations

import pytest
import torch

from kloop.evaluator.harness import expected as expected_mod
from kloop.evaluator.harness.expected import ExpectedStore


def _edge_pair(dtype: torch.dtype, n: int = 4096, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(seed)
    e = torch.randn(n, generator=gen, dtype=torch.float64) * 10
    g = e.clone()
    tol = 1e-3
    specials = [float("nan"), float("inf"), float("-inf"), 3e38, -3e38, 0.0, 1e-40]
    idx = torch.randint(0, n, (64,), generator=gen)
    for k, i in enumerate(idx.tolist()):
        kind = k % 6
        if kind == 0:  # a special value on one side or both
            e[i] = specials[k % len(specials)]
            g[i] = specials[(k // 6) % len(specials)]
        elif kind == 1:  # exactly at the bound, computed as the comparison computes it
            g[i] = e[i] + (tol + tol * abs(e[i]))
        elif kind == 2:  # just past the bound
            g[i] = e[i] + 1.01 * (tol + tol * abs(e[i]))
        elif kind == 3:  # just inside
            g[i] = e[i] - 0.99 * (tol + tol * abs(e[i]))
    return e.to(dtype), g.to(dtype), torch.tensor(tol)


def _agree(store: ExpectedStore, index: int, got: list[torch.Tensor], tol: float) -> bool:
    full = all(d.ok for d in store.compare(index, got, tol))
    assert store.passes(index, got, tol) == full
    return full


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
def test_the_quick_test_agrees_with_the_full_comparison_element_by_element(dtype):
    e, g, tol = _edge_pair(dtype)
    store = ExpectedStore(n_calls=1)
    verdicts = []
    # Every element on its own (each one a call), so any single element where the two tests
    # part shows up.
    for i in range(0, e.numel(), 1):
        store.outputs = {0: [e[i:i + 1].clone()]}
        store.positions = [None]
        verdicts.append(_agree(store, 0, [g[i:i + 1].clone()], float(tol)))
    assert True in verdicts and False in verdicts  # both answers were exercised


def test_whole_outputs_shapes_counts_integers_and_a_zero_tolerance():
    store = ExpectedStore(n_calls=2)
    a = torch.randn(3, 5)
    store.add(0, [a, torch.arange(6)])
    store.add(1, [a * 2, torch.arange(6)])
    assert _agree(store, 0, [a.clone(), torch.arange(6)], 1e-4)
    assert not _agree(store, 0, [a.clone(), torch.arange(6) + 1], 1e-4)
    assert not _agree(store, 1, [a.clone(), torch.arange(6)], 1e-4)
    assert not _agree(store, 0, [a.clone()], 1e-4)  # an output missing
    assert not _agree(store, 0, [a.reshape(5, 3).clone(), torch.arange(6)], 1e-4)
    assert not _agree(store, 0, [a.double(), torch.arange(6)], 1e-4)
    # No tolerance: exact equality on both sides.
    assert _agree(store, 0, [a.clone(), torch.arange(6)], 0.0)
    assert not _agree(store, 0, [a + 1e-6, torch.arange(6)], 0.0)


def test_sampled_outputs_are_tested_at_the_same_secret_positions(monkeypatch):
    monkeypatch.setattr(expected_mod, "FULL_BUDGET_BYTES", 1024)
    store = ExpectedStore(n_calls=4)
    big = torch.randn(1 << 16)
    store.add(0, [big])
    assert store.sampled
    assert _agree(store, 0, [big.clone()], 1e-4)
    bad = big.clone()
    bad[store.positions[0][0]] += 1.0  # type: ignore[index]
    assert not _agree(store, 0, [bad], 1e-4)


def _served(outs: list[torch.Tensor]):
    """`outs` as a served call leaves them: in one buffer laid out by `ServeLayout`."""
    import numpy as np

    from kloop.evaluator.common.wire import ServeLayout
    from kloop.evaluator.harness.output import Output

    layout = ServeLayout.of([(list(o.shape), str(o.dtype)) for o in outs])
    buf = np.zeros(layout.total, dtype=np.uint8)
    for s, o in zip(layout.slots, outs, strict=True):
        raw = o.contiguous().reshape(-1).view(torch.uint8).numpy()
        buf[s.offset:s.offset + s.nbytes] = raw
    return Output(layout, buf)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64,
                                   torch.int64, torch.int8, torch.bool, torch.complex64])
def test_a_served_output_reads_back_whole_and_at_positions_bit_for_bit(dtype):
    gen = torch.Generator().manual_seed(7)
    first = (torch.randn(3, 1001, generator=gen) * 100).to(dtype)
    second = (torch.randn(17, generator=gen) * 100).to(dtype)  # an unaligned slot after it
    out = _served([first, second, torch.empty(0, 4, dtype=dtype)])
    whole = out.tensors()
    assert [t.shape for t in whole] == [first.shape, second.shape, (0, 4)]
    assert all(t.dtype == dtype for t in whole)
    assert torch.equal(whole[0].view(torch.uint8), first.view(torch.uint8))
    assert torch.equal(whole[1].view(torch.uint8), second.view(torch.uint8))
    pos = torch.randint(0, first.numel(), (257,), generator=gen)
    assert torch.equal(out.at(0, pos).view(torch.uint8),
                       first.reshape(-1)[pos].view(torch.uint8))


def test_a_sampled_store_reads_only_its_positions_of_a_served_output(monkeypatch):
    """The reference's and the candidate's outputs come as served `Output`s: a sampled store
    keeps and compares the same elements it would have taken from whole tensors, and never
    copies an output out whole (the cost it exists to avoid)."""
    from kloop.evaluator.harness.output import Output

    monkeypatch.setattr(expected_mod, "FULL_BUDGET_BYTES", 1024)

    class NoWhole(Output):
        def whole(self, k):
            raise AssertionError("copied whole")

    big, small = torch.randn(1 << 16), torch.randn(8)
    served = _served([big, small])
    ref = ExpectedStore(n_calls=3)
    ref.add(0, served)
    assert ref.positions is not None and ref.positions[0] is not None
    assert ref.positions[1] is None  # a small output is kept whole even when sampling
    assert torch.equal(ref.outputs[0][0], big[ref.positions[0]])
    assert torch.equal(ref.outputs[0][1], small)

    ref.positions[1] = torch.arange(8)  # every output sampled: nothing may be copied whole
    good = _served([big.clone(), small.clone()])
    assert ref.passes(0, NoWhole(good.layout, good.buf), 1e-4)
    bad_big = big.clone()
    bad_big[ref.positions[0][5]] += 1.0
    bad = _served([bad_big, small.clone()])
    assert not ref.passes(0, NoWhole(bad.layout, bad.buf), 1e-4)
    diffs = ref.compare(0, NoWhole(bad.layout, bad.buf), 1e-4)
    assert not diffs[0].ok and "secret positions" in (diffs[0].message or "") and diffs[1].ok
    # Tensors and served outputs get the same answers from one store.
    assert ref.passes(0, [big.clone(), small.clone()], 1e-4)
    assert not ref.passes(0, [bad_big, small.clone()], 1e-4)


def test_the_quick_test_answers_as_torch_isclose_on_every_edge():
    """`_close` answers yes from a few in-place passes and leaves every no to `torch.isclose`:
    its answers must be isclose's on the edges (NaN, equal and unequal infinities, a finite
    value against an infinite one, values near the float's limit, the tolerance's border)."""
    from kloop.evaluator.harness.expected import _close

    inf, nan, big = float("inf"), float("nan"), torch.finfo(torch.float32).max
    tol = 1e-4
    edges = [0.0, 1.0, -1.0, 1e-4, 2e-4, inf, -inf, nan, big, -big, 1e30, 3e38]
    rng = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64, torch.float16):
        for a in edges:
            for b in edges:
                e = torch.tensor([1.0, a, 2.0], dtype=dtype)
                g = torch.tensor([1.0, b, 2.0], dtype=dtype)
                wide = torch.float64 if dtype == torch.float64 else torch.float32
                want = bool(torch.isclose(g.to(wide), e.to(wide), rtol=tol, atol=tol).all())
                assert _close(e, g, tol) == want, (dtype, a, b)
        # The border: an error just inside and just outside tol + tol*|e|.
        e = torch.randn(1000, generator=rng, dtype=torch.float64).to(dtype)
        for k in (0.5, 0.99, 1.01, 2.0):
            g = (e.double() + k * (tol + tol * e.double().abs())).to(dtype)
            wide = torch.float64 if dtype == torch.float64 else torch.float32
            want = bool(torch.isclose(g.to(wide), e.to(wide), rtol=tol, atol=tol).all())
            assert _close(e, g, tol) == want, (dtype, k)
