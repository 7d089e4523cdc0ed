"""The ray executor's driver side: a pool of evaluation workers on a Ray cluster, behind the
loop's `Evaluator` protocol.

Each worker is an actor holding one unit of `executor.resource` (one GPU by default), placed on
its node by the plan (`agent.executor.placement`); it runs kloop's evaluator with up to
`worker_concurrency` evaluations in flight, and its own device lock keeps timings apart as on
one host. The driver sends each candidate's source and its problem (by content, through the
object store) to the least busy worker and gets an `EvalResult` back; the LLM calls and the run
directory never leave the driver.

Faults. A worker or node lost mid-evaluation is an infrastructure fault: the candidate goes to
another worker (`max_attempts` in all), the turn is recorded once, when a verdict comes back,
and never as the model's. A node that loses `drain_after` evaluations gets no more work; the
run carries on with the nodes that remain and the summary names the ones drained or lost. An
exception of the evaluator itself ends the episode as it does locally (`EvalInfraError`).

Hardware. Speedups are compared within one GPU model only: every evaluation of a problem goes
to workers of one model (its home, the model with the fewest problems per worker when the
problem is first seen), so a problem's best kernel is picked among timings of one kind of GPU;
a problem moves (with a warning) only when no worker of its model is left. Baselines are
measured on each worker's own GPU and cached per GPU model, as on one host.
"""

from __future__ import annotations

import atexit
import logging
import threading
from dataclasses import dataclass
from typing import Any

from kloop.agent.config import ExecutorConfig, RunConfig
from kloop.agent.errors import EvalInfraError
from kloop.agent.executor.placement import NodeSlots, plan
from kloop.agent.executor.ray_worker import EvalWorker, WorkerInfo
from kloop.agent.records import ExecutorReport, NodeReport
from kloop.evaluator.common.result import EvalResult
from kloop.problems.registry import Problem

from kloop.errors import KloopError

log = logging.getLogger(__name__)
HELLO_TIMEOUT_S = 300.0


def import_ray() -> Any:
    try:
        import ray
    except ImportError:
        raise EvalInfraError('the ray executor needs Ray: pip install -e ".[ray]" '
                             'in the kloop clone') from None
    return ray


def connect(ex: ExecutorConfig) -> bool:
    """Join the configured cluster (or start one on this machine); True if this call did, so
    that closing the pool leaves a connection the caller made alone."""
    ray = import_ray()
    if ray.is_initialized():
        return False
    if ex.address is None:
        # A Ray of this machine alone; a stand-in resource gets one unit, as a GPU would.
        extra = {} if ex.resource == "GPU" else {"resources": {ex.resource: 1}}
        ray.init(include_dashboard=False, log_to_driver=False, **extra)
    else:
        try:
            ray.init(address=ex.address, log_to_driver=False)
        except ConnectionError as e:
            # Ray's own message names its `--address` flag, which kloop does not have.
            raise RayClusterMissing(
                f"no Ray cluster at {ex.address!r} ({str(e).split('.')[0].strip()}): start one "
                "with `ray start --head`, or give kloop --ray-address HOST:PORT "
                "(executor.address); without --ray-address kloop starts Ray on this machine") from None
    return True


class RayClusterMissing(KloopError):
    """`--executor ray` names a cluster that cannot be reached."""


@dataclass
class _Worker:
    index: int
    handle: Any
    node_id: str
    hardware: str | None = None
    in_flight: int = 0
    alive: bool = True


class RayPool:
    """A Ray cluster's evaluation workers (see the module's docstring). One per process and
    executor config (`pool`): the runs of a sweep share its workers and their warm state."""

    def __init__(self, ex: ExecutorConfig, device: str) -> None:
        self.ray = import_ray()
        from ray.exceptions import (
            NodeDiedError,
            ObjectLostError,
            RayActorError,
            RayTaskError,
            WorkerCrashedError,
        )

        self._lost_errors = (RayActorError, WorkerCrashedError, NodeDiedError, ObjectLostError)
        self._task_error = RayTaskError
        self.ex, self.device = ex, device
        self._owns = connect(self.ex)
        self._cond = threading.Condition()
        self._refs: dict[str, Any] = {}
        self.workers: list[_Worker] = []
        self.nodes: dict[str, NodeReport] = {}
        self.home: dict[str, str] = {}
        self.requeued = 0
        self._actor = self.ray.remote(EvalWorker)
        slots = plan(self.ray.nodes(), self.ex.resource)
        if not slots:
            self.close()
            raise EvalInfraError(f"no live node of the Ray cluster offers the resource "
                                 f"{self.ex.resource!r} (executor.resource): nothing to evaluate on")
        for s in slots:
            self.nodes[s.node_id] = NodeReport(node_id=s.node_id, address=s.address,
                                               workers=s.workers)
            for _ in range(s.workers):
                self._start(s)
        self._hello()

    @staticmethod
    def key(ex: ExecutorConfig, device: str) -> str:
        return ex.model_dump_json() + device

    # -- workers ------------------------------------------------------------------------------
    def _start(self, slot: NodeSlots | str, hardware: str | None = None) -> _Worker:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        node_id = slot if isinstance(slot, str) else slot.node_id
        unit = ({"num_gpus": 1} if self.ex.resource == "GPU"
                else {"resources": {self.ex.resource: 1}})
        handle = self._actor.options(
            num_cpus=0, max_concurrency=self.ex.worker_concurrency, max_restarts=0, **unit,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id, soft=False),
        ).remote(self.device)
        worker = _Worker(index=len(self.workers), handle=handle, node_id=node_id,
                         hardware=hardware)
        self.workers.append(worker)
        return worker

    def _hello(self) -> None:
        """Each worker's device by name (the hardware its problems are pinned to)."""
        ready = {w.index: w.handle.hello.remote() for w in self.workers}
        for w in self.workers:
            try:
                info = WorkerInfo.model_validate_json(
                    self.ray.get(ready[w.index], timeout=HELLO_TIMEOUT_S))
            except self._lost_errors as e:
                # No evaluation was lost: the worker never started, and the run goes on without
                # it (a replacement would have no hardware name to be pinned by).
                w.alive = False
                if not self._node_alive(w.node_id):
                    self.nodes[w.node_id].state = "lost"
                log.warning("worker %d on node %s did not start: %s", w.index, w.node_id[:12],
                            str(e).splitlines()[0])
                continue
            except self.ray.exceptions.GetTimeoutError:
                self.close()
                raise EvalInfraError(f"worker {w.index} on node {w.node_id[:12]} did not start "
                                     f"in {HELLO_TIMEOUT_S:.0f} s (is its {self.ex.resource} "
                                     "held by another job?)") from None
            w.hardware = info.hardware
            self.nodes[w.node_id].hardware = info.hardware

    def _node_alive(self, node_id: str) -> bool:
        return any(n["NodeID"] == node_id and n.get("Alive") for n in self.ray.nodes())

    def _lost(self, w: _Worker, error: Exception) -> None:
        """An evaluation was lost with `w` (its actor or node died): it is re-queued; the
        node is drained or the worker replaced."""
        with self._cond:
            self.requeued += 1
            node = self.nodes[w.node_id]
            node.lost += 1
            w.alive = False
            if node.state == "active":
                if not self._node_alive(w.node_id):
                    node.state = "lost"
                elif node.lost >= self.ex.drain_after:
                    node.state = "drained"
                if node.state != "active":
                    log.warning("node %s (%s) %s after %d lost evaluation(s): %s",
                                w.node_id[:12], node.address, node.state, node.lost,
                                str(error).splitlines()[0])
                    for other in self.workers:
                        if other.node_id == w.node_id and other.alive:
                            other.alive = False
                            self.ray.kill(other.handle)
                else:
                    log.warning("worker %d on node %s lost an evaluation; starting another: %s",
                                w.index, w.node_id[:12], str(error).splitlines()[0])
                    self._start(w.node_id, w.hardware)
            self._cond.notify_all()

    # -- dispatch -----------------------------------------------------------------------------
    def _home(self, problem: Problem, live: list[_Worker]) -> str | None:
        models = {w.hardware for w in live}
        home = self.home.get(problem.id)
        if home in models:
            return home
        per_worker = {m: (sum(1 for h in self.home.values() if h == m)
                          / sum(1 for w in live if w.hardware == m)) for m in models}
        chosen = min(sorted(models, key=str), key=lambda m: per_worker[m])
        if home is not None:
            log.warning("%s: no worker on %s is left; its evaluations move to %s (speedups "
                        "measured on both are not compared)", problem.id, home, chosen)
        self.home[problem.id] = chosen  # type: ignore[assignment]
        return chosen

    def _acquire(self, problem: Problem) -> _Worker:
        with self._cond:
            while True:
                live = [w for w in self.workers if w.alive]
                if not live:
                    gone = ", ".join(f"{n.address} ({n.state})" for n in self.nodes.values())
                    raise EvalInfraError(f"no evaluation worker is left on the Ray cluster: {gone}")
                home = self._home(problem, live)
                free = [w for w in live if w.hardware == home
                        and w.in_flight < self.ex.worker_concurrency]
                if free:
                    w = min(free, key=lambda w: (w.in_flight, w.index))
                    w.in_flight += 1
                    return w
                self._cond.wait(timeout=1.0)

    def _release(self, w: _Worker) -> None:
        with self._cond:
            w.in_flight -= 1
            self._cond.notify_all()

    def _problem_ref(self, problem: Problem) -> Any:
        with self._cond:
            if problem.sha256 not in self._refs:
                self._refs[problem.sha256] = self.ray.put(problem)
            return self._refs[problem.sha256]

    def evaluate(self, problem: Problem, source: str, config: str) -> EvalResult:
        """`source` judged for `problem` under `config` (an EvalConfig as JSON) by a worker."""
        ref = self._problem_ref(problem)
        for _ in range(self.ex.max_attempts):
            w = self._acquire(problem)
            try:
                out = self.ray.get(w.handle.evaluate.remote(ref, source, config))
            except self._lost_errors as e:
                self._lost(w, e)
                continue
            except self._task_error as e:
                raise EvalInfraError(f"evaluator failed on {problem.id} on node "
                                     f"{self.nodes[w.node_id].address}: {e}") from None
            finally:
                self._release(w)
            with self._cond:
                self.nodes[w.node_id].evaluations += 1
            return EvalResult.model_validate_json(out)
        raise EvalInfraError(f"{problem.id}: the evaluation was lost with its worker "
                             f"{self.ex.max_attempts} times")

    # -- reporting ----------------------------------------------------------------------------
    def in_flight(self) -> dict[str, int]:
        """Evaluations in flight per node id (for progress displays and tests)."""
        with self._cond:
            out: dict[str, int] = {}
            for w in self.workers:
                if w.alive and w.in_flight:
                    out[w.node_id] = out.get(w.node_id, 0) + w.in_flight
            return out

    def report(self) -> ExecutorReport:
        with self._cond:
            return ExecutorReport(address=self.ex.address,
                                  nodes=[n.model_copy() for n in self.nodes.values()],
                                  requeued=self.requeued)

    def close(self) -> None:
        _pools.pop(self.key(self.ex, self.device), None)  # under _pools_guard or at exit
        for w in self.workers:
            if w.alive:
                w.alive = False
                try:
                    self.ray.kill(w.handle)
                except Exception:  # noqa: BLE001 - already gone with its node
                    pass
        if self._owns and self.ray.is_initialized():
            self.ray.shutdown()


_pools: dict[str, RayPool] = {}
_pools_guard = threading.Lock()


def pool(ex: ExecutorConfig, device: str) -> RayPool:
    """This process's pool for `ex` on `device`, started on first use, closed at exit."""
    with _pools_guard:
        key = RayPool.key(ex, device)
        if key not in _pools:
            # Another pool on the same cluster and resource holds every unit of it: its workers
            # go first, or the new pool's could never be placed.
            for other in [p for p in _pools.values()
                          if (p.ex.address, p.ex.resource) == (ex.address, ex.resource)]:
                other.close()
            _pools[key] = RayPool(ex, device)
            if len(_pools) == 1:
                atexit.register(close_pools)
        return _pools[key]


def describe() -> str:
    """`Ray: 5 in flight on 3 worker(s)` for the progress line (empty: no pool in this process)."""
    with _pools_guard:
        pools = list(_pools.values())
    if not pools:
        return ""
    flying = sum(sum(p.in_flight().values()) for p in pools)
    workers = sum(1 for p in pools for w in p.workers if w.alive)
    return f"Ray: {flying} in flight on {workers} worker(s)"


def close_pools() -> None:
    for p in list(_pools.values()):
        p.close()


class RayEvaluator:
    """The loop's `Evaluator` on the ray executor: a run's per-problem configs over the pool."""

    def __init__(self, cfg: RunConfig, problems: list[Problem]) -> None:
        from kloop.agent.components import problem_configs

        self.pool = pool(cfg.executor, cfg.eval.device)
        self.base = cfg.eval.model_dump_json()
        self.configs = {pid: c.model_dump_json()
                        for pid, c in problem_configs(cfg.eval, cfg.problem_overrides,
                                                      problems).items()}

    def evaluate(self, problem: Problem, source: str) -> EvalResult:
        return self.pool.evaluate(problem, source, self.configs.get(problem.id, self.base))

    def report(self) -> ExecutorReport:
        return self.pool.report()
