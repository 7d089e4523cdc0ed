"""One queue of candidates per process: their CPU stages run ahead of the device.

An evaluation has front stages, which never touch the device (static checks, the contained
CUDA build), and device stages (the reference worker, the candidate child), which wait for
the device lock. With one pool of N threads, a batch keeps N evaluations in flight and a
candidate N+1 places down the queue starts its 40 s build only when one ahead of it has left
the device: the GPU idles while it builds. Here front stages run on threads of their own, up
to `ahead` evaluations beyond the `device_slots` in their device stages, and an evaluation
enters its device stages in the order its front stages finished. Only that order and that
overlap change: every evaluation runs the same stages, with the same checks, as `evaluate`.

`device_slots` bounds what waits on the device lock with models prepared in memory (reference
workers, candidate children built ahead), as a plain pool of that size did. The in-flight bound
(`device_slots + ahead`) also bounds what holds a sandbox uid (`EvalConfig.sandbox_uids`).

Those models share the GPU's memory while they wait: an evaluation that runs out of it beside
another is judged again alone (`pipeline.device_half`, `procs.devicegate`).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from concurrent.futures import CancelledError, Future, ThreadPoolExecutor

from kloop.evaluator.common.config import EvalConfig
from kloop.evaluator.common.result import EvalResult
from kloop.evaluator.harness.outcome import Finding
from kloop.evaluator.harness.pipeline import (
    DEVICE_STAGES,
    FRONT_STAGES,
    Stage,
    decided,
    device_half,
    finish,
    run_stages,
    start,
)
from kloop.evaluator.harness.state import EvalRun
from kloop.evaluator.procs import board
from kloop.evaluator.procs.buildslots import default_slots
from kloop.problems.registry import Problem

Stages = Sequence[Stage]

class Scheduler:
    """`submit` a candidate, get a future of its result; `close` (or leaving the `with`) waits
    for every submitted one, or, leaving on an error, for those already started only.
    Evaluator faults come back as the future's exception, as `evaluate` raises them."""

    def __init__(self, device_slots: int = 4, ahead: int | None = None,
                 stages: tuple[Stages, Stages] = (FRONT_STAGES, DEVICE_STAGES)) -> None:
        """`stages`: the front and the device stages (tests put probes around them)."""
        if device_slots < 1:
            raise ValueError("device_slots must be at least 1")
        self.device_slots = device_slots
        self._front_stages, self._device_stages = stages
        self.ahead = default_slots() if ahead is None else max(0, ahead)
        # Acquired before a run is created, released when it is finished: a queue of 10 000
        # candidates holds only this many work dirs, uids and device claims at once.
        self._in_flight = threading.BoundedSemaphore(device_slots + self.ahead)
        self._front = ThreadPoolExecutor(device_slots + self.ahead, thread_name_prefix="kloop-front")
        self._device = ThreadPoolExecutor(device_slots, thread_name_prefix="kloop-device")
        # Makes "counted as queued" and "in the device pool's queue" one step: whoever is
        # counted first is queued first, so the count tells a watcher the order is settled.
        self._handoff = threading.Lock()
        self._closed = False
        self._cancelled = False

    def submit(self, problem: Problem | str, source: str,
               config: EvalConfig | None = None) -> Future[EvalResult]:
        if self._closed:
            raise RuntimeError("the scheduler is closed")
        out: Future[EvalResult] = Future()
        out.set_running_or_notify_cancel()
        self._front.submit(self._front_half, problem, source, config or EvalConfig(), out)
        return out

    def _front_half(self, problem: Problem | str, source: str, config: EvalConfig,
                    out: Future[EvalResult]) -> None:
        self._in_flight.acquire()
        if self._cancelled:  # checked after the wait for a place in flight too
            self._in_flight.release()
            out.set_exception(CancelledError())
            return
        run: EvalRun | None = None
        findings: list[Finding] = []
        try:
            run = start(problem, source, config)
            run_stages(run, self._front_stages, findings)
        except BaseException as e:  # noqa: BLE001 (the caller gets it through the future)
            self._done(run, findings, out, error=e)
            return
        if decided(run, findings):  # ended before the device (a compile error, a static rule)
            self._done(run, findings, out)
        else:  # in the order front stages finish; the device pool's queue is first in, first out
            with self._handoff:
                board.enter("queued")
                self._device.submit(self._device_half, run, findings, out)

    def _device_half(self, run: EvalRun, findings: list[Finding],
                     out: Future[EvalResult]) -> None:
        board.leave("queued")
        if self._cancelled:
            self._done(run, findings, out, error=CancelledError())
            return
        last, findings, error = device_half(run, findings,
                                            (self._front_stages, self._device_stages))
        self._done(last, findings, out, error=error)

    def _done(self, run: EvalRun | None, findings: list[Finding], out: Future[EvalResult],
              error: BaseException | None = None) -> None:
        result = None
        try:
            if error is None and run is not None:
                result = finish(run, findings)
            elif run is not None:
                run.cleanup()
        except BaseException as e:  # noqa: BLE001
            error = error or e
        finally:
            self._in_flight.release()
        if error is not None:
            out.set_exception(error)
        else:
            out.set_result(result)

    def close(self, cancel: bool = False) -> None:
        """Wait for every submitted evaluation (front halves first: they hand work on). With
        `cancel`, those not yet started end at once with `CancelledError` (their work dirs and
        leases released); those running finish."""
        self._closed = True
        self._cancelled = self._cancelled or cancel
        self._front.shutdown(wait=True)
        self._device.shutdown(wait=True)

    def __enter__(self) -> Scheduler:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        # Leaving on an error (Ctrl-C, an evaluator fault the caller raised again): the queue
        # behind it is not worth the wait.
        self.close(cancel=exc_type is not None)
