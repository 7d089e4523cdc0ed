"""The whole-output copy after a timed call: every byte, in shares on several threads when the
output is large, each share starting on a line of the clock's snapshot."""

from __future__ import annotations

import numpy as np
import pytest

from kloop.evaluator.harness import output


@pytest.mark.parametrize("size", [0, 1, 63, 64, 4097, 1 << 16, (1 << 16) + 13])
def test_every_byte_is_copied_whatever_the_size(monkeypatch, size):
    monkeypatch.setattr(output, "PARALLEL_COPY_BYTES", 1000)  # large from 1000 bytes
    src = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8)
    dst = np.zeros(size, dtype=np.uint8)
    output.copy_whole(dst, src)
    assert np.array_equal(dst, src)


def test_a_large_copy_runs_in_shares_that_start_on_lines(monkeypatch):
    monkeypatch.setattr(output, "PARALLEL_COPY_BYTES", 1000)
    seen: list[tuple[int, int]] = []
    real = np.copyto

    def spy(dst, src):
        seen.append((src.__array_interface__["data"][0] - base, src.size))
        real(dst, src)

    src = np.arange(10_000, dtype=np.uint8)
    base = src.__array_interface__["data"][0]
    monkeypatch.setattr(output.np, "copyto", spy)
    output.copy_whole(np.empty_like(src), src)
    starts = sorted(s for s, _ in seen)
    assert len(seen) == output.COPY_THREADS
    assert all(s % output.LINE == 0 for s in starts)
    assert sum(n for _, n in seen) == src.size  # no byte twice, none left out
