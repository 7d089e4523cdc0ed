"""A budget for the probe trials' outputs of evaluations in their device stages.

Why: the reference worker writes one expected output per probe trial (six at the default
policy), which the harness then holds in its memory until each trial is judged; the candidate
writes each trial's output (and the repeated call's) into its dir one after another, without
waiting for the harness, which judges and deletes them in turn. For most problems that is
megabytes. For L3/17 (a 4.3 GB output at full size) it is up to 56 GB per evaluation (26 GB in
the harness's memory, 30 GB on disk), and a batch keeps up to `device_slots` evaluations in
their device stages at once: two would not fit a device host (128 GiB of memory, 64 GiB of
disk). Each evaluation reserves what its outputs take before its device stages and gives it
back after them; one larger than the whole budget waits until it is the only one holding any.

The size comes from the problem's full-size output shape (`ProblemMeta.output_shape`) at four
bytes an element, the widest output a policy checks in its trials; a run with problem
overrides (other sizes) or without a known shape reserves nothing, as before. The budget is
half the work dir's free disk, the smaller of the two on such a host. Other processes on the
host are not counted: one kloop process per host is the setting this covers, as for
`procs.devicegate`.
"""

from __future__ import annotations

import contextlib
import math
import shutil
import threading
from collections.abc import Iterator
from pathlib import Path

SHARE = 0.5
"""Of the work dir's free disk, when the budget is first used: the rest is left to builds,
caches and whatever else writes there."""
AT_LEAST = 256 << 20
"""Outputs below this per evaluation reserve nothing: the budget is for the few problems whose
outputs take gigabytes."""
ELEMENT_BYTES = 4


def output_bytes(shape: list[int] | list[list[int]] | None) -> int | None:
    """Bytes of one call's outputs at four bytes an element; None without a shape."""
    if not shape:
        return None
    shapes = shape if isinstance(shape[0], list) else [shape]
    return sum(math.prod(s) for s in shapes) * ELEMENT_BYTES  # type: ignore[arg-type]


def candidate_bytes(shape: list[int] | list[list[int]] | None, trials: int) -> int:
    """What a candidate's own trial outputs may take at once: each trial's and the repeated
    call's. The child writes them one after another without waiting for the harness, which
    judges (and then deletes) each in turn, so at full size they pile up: on an H100 at
    45017da, L3/17's reference submitted as a candidate passed 16 GiB four trials in while the
    harness judged the first (`disk_limit_gb` killed it)."""
    one = output_bytes(shape)
    return 0 if one is None else one * (trials + 1)


def trial_bytes(shape: list[int] | list[list[int]] | None, trials: int) -> int:
    """What an evaluation's probe-trial outputs take at once at most: each trial's expected
    output (in the harness's memory until judged) and the candidate's own (`candidate_bytes`)."""
    one = output_bytes(shape)
    if one is None:
        return 0
    need = one * trials + candidate_bytes(shape, trials)
    return need if need >= AT_LEAST else 0


class HostBytes:
    def __init__(self, total: int | None = None) -> None:
        self._total = total
        self._cond = threading.Condition()
        self._held = 0
        self._holders = 0

    def total(self, where: Path) -> int:
        if self._total is None:
            self._total = int(shutil.disk_usage(where).free * SHARE)
        return self._total

    @property
    def held(self) -> int:
        return self._held

    @contextlib.contextmanager
    def reserve(self, n: int, where: Path) -> Iterator[None]:
        """`n` bytes for the block, waiting while they do not fit beside what others hold; a
        request of more than the whole budget waits until nothing else is held."""
        if n <= 0:
            yield
            return
        with self._cond:
            total = self.total(where)
            while self._holders and self._held + n > total:
                self._cond.wait()
            self._held += n
            self._holders += 1
        try:
            yield
        finally:
            with self._cond:
                self._held -= n
                self._holders -= 1
                self._cond.notify_all()


BUDGET = HostBytes()
"""This process's."""
