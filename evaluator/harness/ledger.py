"""What one stage of an evaluation finds (`Ledger`): the findings it adds, read over those of
the stages before it.

A stage takes the run's resources (`evaluator.harness.state.EvalRun`) and the findings before
it, and returns its own: `evaluator.harness.pipeline.run_stages` keeps the list, in order, and
the result is its fold (`evaluator.harness.outcome.fold`). A stage can read the verdict so far
(`Ledger.verdict`, made afresh on every read) but never write one, nor touch a finding of an
earlier stage.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kloop.evaluator.common.result import ErrorInfo, Stage, Status
from kloop.evaluator.harness.outcome import Clocked, Decided, Finding, Verdict, verdict_of


@dataclass
class Ledger:
    """One stage's findings (`found`, in order) over the earlier stages' (`before`)."""

    root: Path
    """The evaluation's dir: kept out of the error text the model sees (`outcome.fold`)."""
    before: Sequence[Finding] = ()
    found: list[Finding] = field(default_factory=list)
    _mark: tuple[str, float] | None = None

    def record(self, *findings: Finding) -> None:
        self.found.extend(findings)

    @property
    def verdict(self) -> Verdict:
        """The fold of every finding so far, made afresh: a copy nobody can write back."""
        return verdict_of([*self.before, *self.found], self.root)

    def stop(self, status: Status, stage: Stage, error: ErrorInfo | None = None) -> None:
        """A verdict (`Decided`: the first one stands)."""
        self.record(Decided(status=status, stage=stage, error=error))

    def clock(self, name: str, seconds: float) -> None:
        """Seconds the harness spent on `name` (added up per name in `stage_seconds`)."""
        self.record(Clocked(name=name, seconds=seconds))

    @contextlib.contextmanager
    def timed(self, name: str) -> Iterator[None]:
        """Adds the block's wall time to `stage_seconds[name]`, less its wait for the device
        (which `stage_seconds["device_wait"]` counts)."""
        t0 = time.monotonic()
        w0 = self._waited()
        try:
            yield
        finally:
            self.clock(name, time.monotonic() - t0 - (self._waited() - w0))

    def _waited(self) -> float:
        return sum(f.seconds for f in self.found if isinstance(f, Clocked) and f.name == "device_wait")

    def since_mark(self, name: str) -> float | None:
        """Seconds since the child stage `name` began, while it is the running one."""
        return time.monotonic() - self._mark[1] if self._mark and self._mark[0] == name else None

    def mark(self, name: str | None) -> None:
        """Close the running child stage's wall time (if any) and start timing `name`."""
        now = time.monotonic()
        if self._mark is not None:
            prev, t0 = self._mark
            self.clock(prev, now - t0)
        self._mark = (name, now) if name is not None else None
