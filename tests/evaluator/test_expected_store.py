"""The timed calls' quick test (`ExpectedStore.passes`) answers exactly as the full comparison
(`evaluator.correctness`) does, on values chosen to sit where the two could part: NaN, equal and
opposite infinities, overflow in the difference, elements exactly at the bound, half and double
precision, integer outputs, no tolerance, sampled outputs."""

from __future__ import annotations

import pytest
import torch

from evaluator.harness import expected as expected_mod
from evaluator.harness.expected import ExpectedStore


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
