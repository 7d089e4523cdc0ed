"""Baseline workers kept between evaluations of one problem (`EvalConfig.kept_baselines`).

Paired timing puts the candidate and its baselines in the same hold of the device
(`harness.paired`). Served by each evaluation's own reference worker, the compiled baselines
came from the inductor cache and compiled again at their first paired call, under the lock, for
every candidate: 2.7 / 10.0 / 17.5 s of a correct candidate's hold on L3/1, 11 and 21 at full
size against 1.7-4.8 s of timed calls (the H100, 2026-12-05 at 92b4b81). A kept worker compiles
them once.

What a kept worker changes, and what it does not:
- It is a reference worker (trusted code only) started like an evaluation's, with no trials, in
  a run of its own (its own dir, no sandbox uid: nothing of a candidate's reaches it). Its models
  are built under a secret construction seed of their own: the same shapes, dtypes and
  distribution as each evaluation's, so the same work for the same inputs, and no output of
  theirs is ever read (`paired.run_paired` reads only the candidate's and an incumbent's).
  The same work holds where a forward's path does not depend on its weights' values: no Level 3
  forward branches on a value or makes a value-dependent shape (no `.item()`, `.any()`, `.all()`,
  `if torch.`, `nonzero`, `masked_select`, `unique`, `topk`, `argmax` or `sort` in a forward;
  the two `.item()` calls are in L3/29's and L3/30's constructors; checked 2026-12-05).
- Every output a candidate is checked against still comes from the evaluation's own reference
  worker, built under the evaluation's secret seed, which ends after its stage.
- The rounds are unchanged: the same seeds on every side, a secret order drawn each round, the
  kept worker's null calls of these rounds as the baselines' handshake.
- It is used only under the device lock, by the evaluation that holds it, one session at a
  time; the flags it raises in a session go to that evaluation.
A worker whose channel broke, that outlived `MAX_AGE_S` or that is closed to make room is
ended; the next evaluation of its problem starts another. One that cannot start is not tried
again in this process for that problem; its evaluations use their own reference worker.
"""

from __future__ import annotations

import atexit
import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from kloop.evaluator.common.protocol import ROLES, Control, FlagMsg, StageMsg
from kloop.evaluator.common.wire import OK
from kloop.evaluator.harness.clock import ChannelBroken
from kloop.evaluator.harness.paired import BASELINE_WARMUP_CALLS
from kloop.evaluator.harness.served import run_plan
from kloop.evaluator.procs.devicegate import out_of_device_memory

if TYPE_CHECKING:
    from kloop.evaluator.common.config import EvalConfig
    from kloop.evaluator.harness.ledger import Ledger
    from kloop.evaluator.harness.reference import ReferenceOutput, Serving
    from kloop.evaluator.harness.state import EvalRun
    from kloop.problems.registry import Problem

log = logging.getLogger(__name__)

ON_GPU = 4
"""Kept workers per process on a GPU when the config leaves it open and the device's free
memory cannot be read (no NVML)."""
AUTO_MAX = 32
"""Kept workers per process at most when the config leaves it open: otherwise as many as the
device's and the host's memory leave room for (`has_room`). `kloop run` keeps one episode per
problem in flight at its concurrency, so with more problems in flight than workers kept, the
others' candidates are judged against their own reference workers, whose compiled baselines
compile again from the cache under the lock (2.7-17.5 s a candidate at full size, H100,
2026-12-05)."""
DEVICE_RESERVE = 0.3
"""Share of the device's memory left free beside the kept workers, for the evaluations timed
beside them (the largest Level 3 reference takes 8-9 GB at full size; a candidate as much)."""
HOST_RESERVE = 16 << 30
"""Host memory left available beside them (each is a process with torch and CUDA loaded)."""
STARTING = (2 << 30, 3 << 30)
"""What a worker being started is counted as until it has allocated: (device, host) bytes."""
MAX_AGE_S = 5 * 3600.0
"""Ended before its child's own limit (`state.PARKED_LIMIT_S`) can end it mid-session."""
END_S = 60.0
"""How long the end of a session (the worker's flags, then stage `paired`) may take."""


def limit(run: EvalRun) -> int | None:
    """How many may be kept: the config's number, 0 on CPU, else None (by memory)."""
    n = run.config.kept_baselines
    return (0 if run.on_cpu else None) if n is None else n


def has_room(kept: int, starting: int, device: tuple[int, int] | None,
             host_available: int | None) -> bool:
    """Whether one more worker may start beside `kept` started and `starting` starting ones,
    given the device's (free, total) memory and the host's available memory (None: unknown,
    then `ON_GPU` at most)."""
    n = kept + starting
    if n >= AUTO_MAX:
        return False
    if device is None or host_available is None:
        return n < ON_GPU
    free, total = device
    dev_start, host_start = STARTING
    return free - starting * dev_start >= DEVICE_RESERVE * total + dev_start and \
        host_available - starting * host_start >= HOST_RESERVE + host_start


def _memory(run: EvalRun) -> tuple[tuple[int, int] | None, int | None]:
    from kloop.evaluator.common.linux import available_bytes
    from kloop.evaluator.harness import gpustate

    gpu = run.timing_spec().gpu
    return (gpustate.memory(gpu) if gpu is not None else None), available_bytes()


def server_key(run: EvalRun) -> str:
    """Everything that decides what a kept worker builds and how it serves, but the
    construction seed: the device, the problem and its sizes, the policy's numerics and input
    distribution, the timing settings, which baselines, and where their cache lives."""
    from kloop.evaluator.harness.reference import baseline_key, timing_key
    from kloop.evaluator.harness.stages import baseline_kinds, reference_serving

    # The full count, whatever this evaluation's plan (`harness.budget`): a kept worker serves
    # any number of calls, and its start times the full count.
    serving = reference_serving(run)
    full = run.timing_spec(full=True)
    return baseline_key({"device": run.device, "timing": timing_key(full),
                         "kinds": baseline_kinds(run), "cache": str(run.config.cache_dir),
                         "calls": full.trials, **serving.key_extra})


@dataclass
class BaselineServer:
    key: str
    run: EvalRun
    """Its own run: its dir and its reference worker (`run.ref_child`), parked."""
    reference: ReferenceOutput
    """What its start measured or read from the cache (the unpaired baselines, flags)."""
    roles: list[str]
    """The roles it serves: eager, and each compiled baseline that has not failed."""
    flags: list[str]
    held_s: float = 0.0
    """Seconds its start held the device lock alone (its reference stage and its warm-up
    calls, or its timed calls after a shared start)."""
    shared_s: float = 0.0
    """Seconds its start held the device shared (`EvalConfig.baseline_start_hold`)."""
    started_at: float = field(default_factory=time.monotonic)
    used_at: float = field(default_factory=time.monotonic)
    pins: int = 0
    """Evaluations that will use it (from their reference stage to their end)."""
    broken: str | None = None
    in_session: threading.Lock = field(default_factory=threading.Lock)

    @property
    def channel(self):
        child = self.run.ref_child
        assert child is not None and child.calls is not None
        return child.calls

    def usable(self) -> bool:
        child = self.run.ref_child
        return self.broken is None and child is not None and child.proc.poll() is None and \
            time.monotonic() - self.started_at < MAX_AGE_S

    def begin(self) -> None:
        """Start a session: the worker serves the next calls (under the caller's device hold)."""
        self.in_session.acquire()
        assert self.run.ref_child is not None
        self.run.ref_child.send(Control(next="serve"))

    def end(self, ledger: Ledger | None, dropped: dict[str, str]) -> None:
        """End the session: stop its calls and read what the worker said up to its next park;
        a role the rounds dropped is not offered again. A worker that does not park in time
        is marked broken (ended on its release)."""
        from kloop.evaluator.harness.outcome import Flagged

        try:
            child = self.run.ref_child
            assert child is not None and child.calls is not None
            self.used_at = time.monotonic()
            for name, why in dropped.items():
                if name in self.roles and name != "eager":
                    self.roles.remove(name)
                    self.flags.append(f"paired_baseline_failed: {name}: {why}")
                elif name == "eager" or "channel broke" in why:
                    self.broken = why
            if self.broken is not None:  # it may be stuck in a call: nothing more to read
                child.kill("broken")
                return
            child.calls.stop(last=False)
            timer = threading.Timer(END_S, child.kill, args=("timeout",))
            timer.start()
            parked = False
            try:
                for msg in child.messages():
                    if isinstance(msg, FlagMsg):
                        if ledger is not None:
                            ledger.record(Flagged(flag=msg.flag))
                        else:
                            self.flags.append(msg.flag)
                    if isinstance(msg, StageMsg) and msg.stage == "paired":
                        parked = True
                        break
            finally:
                timer.cancel()
            if not parked and self.broken is None:
                self.broken = "it ended after a session"
        finally:
            self.in_session.release()

    def close(self) -> None:
        child = self.run.ref_child
        if child is not None and child.calls is not None:
            child.send(Control(next="stop"))
            timer = threading.Timer(END_S, child.kill, args=("timeout",))
            timer.start()
            try:
                for _ in child.messages():
                    pass
                child.outcome()
            finally:
                timer.cancel()
        self.run.cleanup()


class Servers:
    """This process's kept workers, by `server_key`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._servers: dict[str, BaselineServer] = {}
        self._starting: dict[str, threading.Lock] = {}
        self._failed: dict[str, str] = {}
        self._starting_now = 0
        self.started = 0
        """Workers started in this process (the tests and the benches count them)."""

    def ensure(self, run: EvalRun, key: str) -> tuple[BaselineServer | None, bool]:
        """A kept worker for `run`'s problem (`key`: its `server_key`), pinned for `run`
        (release it with `release`), started now if there is none; and whether it was started
        now. None where none may be kept (`limit`, a retry alone), every slot is pinned by other
        evaluations, or one could not start for this problem in this process."""
        cap = limit(run)
        if cap == 0 or run.retried_alone:
            return None, False
        with self._lock:
            starting = self._starting.setdefault(key, threading.Lock())
        with starting:
            victims: list[BaselineServer] = []
            with self._lock:
                s = self._servers.get(key)
                if s is not None and s.usable():
                    s.pins += 1
                    s.used_at = time.monotonic()
                    return s, False
                if s is not None and s.pins == 0:
                    victims.append(self._servers.pop(key))
                    s = None
                if s is not None or key in self._failed:
                    return None, False
                # Workers starting now hold their slots too (`_starting_now`).
                if cap is not None:
                    while len(self._servers) + self._starting_now >= cap:
                        idle = [v for v in self._servers.values() if v.pins == 0]
                        if not idle:
                            break
                        victims.append(self._servers.pop(min(idle, key=lambda v: v.used_at).key))
                    full = len(self._servers) + self._starting_now >= cap
                else:  # by memory: the least recently used idle one makes room, if one is idle
                    full = not has_room(len(self._servers), self._starting_now, *_memory(run))
                    idle = [v for v in self._servers.values() if v.pins == 0]
                    if full and idle:
                        victims.append(self._servers.pop(min(idle, key=lambda v: v.used_at).key))
                        full = False
                if not full:
                    self._starting_now += 1
            for v in victims:
                _close(v)
            if full:
                return None, False
            try:
                s = _start(run, key)
            except Exception as e:  # noqa: BLE001 (its evaluations fall back, and say why)
                log.warning("no kept baseline worker for %s: %s", run.problem.id, e)
                with self._lock:
                    self._starting_now -= 1
                    if not out_of_device_memory(str(e)):  # that one may pass: tried again later
                        self._failed[key] = f"{type(e).__name__}: {str(e)[:300]}"
                return None, False
            except BaseException:
                with self._lock:
                    self._starting_now -= 1
                raise
            with self._lock:
                self._starting_now -= 1
                self.started += 1
                s.pins = 1
                self._servers[key] = s
            return s, True

    def release(self, server: BaselineServer) -> None:
        """`run` is done with it; a broken one is ended now."""
        with self._lock:
            server.pins -= 1
            gone = server.pins == 0 and not server.usable() and \
                self._servers.get(server.key) is server
            if gone:
                self._servers.pop(server.key)
        if gone:
            _close(server)

    def alive(self) -> int:
        with self._lock:
            return len(self._servers)

    def close_idle(self) -> int:
        """End every kept worker no evaluation is using (before an evaluation is judged again
        alone: their device memory is what it may have run out beside); how many."""
        with self._lock:
            idle = [s for s in self._servers.values() if s.pins == 0]
            for s in idle:
                self._servers.pop(s.key)
        for s in idle:
            _close(s)
        return len(idle)

    def close_all(self) -> None:
        with self._lock:
            every = list(self._servers.values())
            self._servers.clear()
            self._failed.clear()
        for s in every:
            _close(s)


def warm(problem: Problem, config: EvalConfig) -> ReferenceOutput | None:
    """Start `problem`'s kept worker in this process ahead of its candidates (a run's or a
    bench's warm-up), left idle for them: its start times the baselines (or reads them from the
    cache) and compiles them, which each candidate's first use would otherwise do under the
    lock. Its baselines, or None where none may be kept (then time them without keeping:
    `pipeline.build_baselines`)."""
    from kloop.evaluator.harness import budget
    from kloop.evaluator.harness.state import EvalRun

    run = EvalRun.create(problem, "", config)
    try:
        key = server_key(run)
        s, _started = SERVERS.ensure(run, key)
        if s is None:
            return None
        budget.remember(key, s.reference.eager, "kept_worker")
        SERVERS.release(s)
        return s.reference
    finally:
        run.cleanup()


def _close(s: BaselineServer) -> None:
    try:
        s.close()
    except Exception as e:  # noqa: BLE001 (its run's cleanup kills what is left)
        log.warning("closing a kept baseline worker: %s", e)
        s.run.cleanup()


def _start(run: EvalRun, key: str) -> BaselineServer:
    """A reference worker in a run of its own, parked after its roles (measured, or read from
    the baseline cache), then its compiled roles compiled by warm-up calls under a hold of the
    device of their own, so no candidate's hold pays for them."""
    from kloop.evaluator.harness.outcome import Clocked, Flagged
    from kloop.evaluator.harness.reference import ReferenceFailure
    from kloop.evaluator.harness.stages import reference_job, reference_serving, reference_stage
    from kloop.evaluator.harness.state import EvalRun

    config = run.config.model_copy(update={"device": run.device, "sandbox_uid": None,
                                           "kept_baselines": 0})
    srun = EvalRun.create(run.problem, "", config)
    if srun.claim is not None:  # not an evaluation in flight: the device pool does not count it
        srun.claim.release()
        srun.claim = None
    try:
        job = reference_job(srun).model_copy(update={
            "trials": [], "served64": [], "fills_path": None, "keep_serving": True})
        serving = reference_serving(srun)
        split = config.baseline_start_hold == "shared"
        found = reference_stage(srun, (), job, serving, warm_only=split)
        ref = srun.reference
        if ref is None or not ref.parked or srun.ref_child is None:
            raise ReferenceFailure("the baseline worker did not park after its roles")
        s = BaselineServer(key=key, run=srun, reference=ref, roles=list(ref.paired_roles),
                           flags=[f.flag for f in found if isinstance(f, Flagged)])
        s.held_s = sum(f.seconds for f in found
                       if isinstance(f, Clocked) and f.name == "reference_held")
        s.shared_s = sum(f.seconds for f in found
                         if isinstance(f, Clocked) and f.name == "reference_shared")
        t1 = time.monotonic()
        if split:
            time_roles(s, serving, job.roles())
        else:
            _warm(s)
        s.held_s += time.monotonic() - t1
        if s.broken is not None:
            raise ReferenceFailure(f"the baseline worker broke in its warm-up: {s.broken}")
    except BaseException:
        srun.cleanup()
        raise
    return s


def time_roles(s: BaselineServer, serving: Serving, roles: list[str]) -> None:
    """A start held shared compiled and warmed its roles and measured nothing: here, alone, one
    session of timed calls on fresh seeds per role, as `collect_reference` times them (eager
    first, with the null calls that give the handshake and the bounds), into its reference
    output and the baseline cache. A compiled role that failed in its start is left out; one
    the cache has a timing for keeps it (as a start held alone does); one whose call fails here
    is dropped and flagged (`BaselineServer.end`)."""
    from kloop.evaluator.harness.reference import (
        COMPILED,
        cache_record,
        measured,
        store_record,
        timed_plan,
    )

    out = s.reference
    record, path = cache_record(serving, out)
    n = len(serving.seeds)
    deadline = time.monotonic() + serving.budget_s
    failed = {r for r in roles if r != "eager" and any(
        f.startswith(f"baseline_{r}_failed") for f in out.flags)}
    s.roles = [r for r in roles if r not in failed]
    dropped: dict[str, str] = {}
    with s.run.gpu_lock():
        s.begin()
        try:
            for role in list(s.roles):
                kept = getattr(record, COMPILED[role], None) if role in COMPILED and \
                    record is not None else None
                if kept is not None:
                    setattr(out, COMPILED[role], kept)
                    continue
                plan = timed_plan(serving, role, by_role=True)
                served = run_plan(s.channel, plan, max(1.0, deadline - time.monotonic()),
                                  lambda i, r: r.status == OK)
                if len(served.wall_ms) < n or served.warmup_done < plan.warmup_calls:
                    dropped[role] = "a call of its start failed"
                    if role == "eager":
                        break
                    continue
                measured(out, role, served, serving.on_cuda)
        except ChannelBroken as e:
            dropped["eager"] = f"the channel broke: {e}"
        finally:
            s.end(None, dropped)
    if "eager" not in dropped:
        store_record(path, record, out, serving)


def _warm(s: BaselineServer) -> None:
    """`BASELINE_WARMUP_CALLS` calls of each role (a compiled one that came from the cache
    compiles at its first); a role whose call fails is dropped, as the rounds would."""
    deadline = time.monotonic() + s.run.config.timeouts.baselines
    dropped: dict[str, str] = {}
    with s.run.gpu_lock():
        s.begin()
        try:
            for role in list(s.roles):
                for _ in range(BASELINE_WARMUP_CALLS):
                    s.channel.prep(deadline)
                    r = s.channel.call(secrets.randbits(62), deadline, role=ROLES[role],
                                       keep=False)
                    if r.status != OK:
                        dropped[role] = "a warm-up call failed"
                        break
        except ChannelBroken as e:
            dropped["eager"] = f"the channel broke: {e}"
        finally:
            s.end(None, dropped)


SERVERS = Servers()
atexit.register(SERVERS.close_all)
