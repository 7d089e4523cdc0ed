"""The device lock: one holder at a time per GPU, host-wide, except trusted work that is never
timed, which may share it, and a candidate's untimed start, which may share it with such work.

Every process whose device work is timed or runs candidate code (the candidate child, a kept
baseline worker's start, the ncu pass) holds the lock until its process is gone (a process
that is gone has no device work left: its CUDA context went with it). Kinds of hold:

- `exclusive`: alone, from the child's first device work to its end.
- `shared`: a reference worker that only makes outputs (`EvalConfig.reference_hold`: its
  baselines are timed by a kept worker under the candidate's hold): beside other shared
  holders and beside a candidate's untimed start, never beside an exclusive holder or a
  candidate's timed calls. Each is gone before its share is given back.
- `shared_trusted`: trusted work that times nothing but whose outcome could be shaped by
  what runs beside it (a kept worker's start compiles, and torch.compile benchmarks kernel
  choices while it does): beside other trusted shared holders only, never candidate code.
- `candidate`: a candidate child (`EvalConfig.candidate_hold`): one candidate at a time; its
  load and correctness trials beside `shared` holders, which time nothing, then `upgrade()`
  before its first timed call: from then on no other process holds the device in any way,
  and the candidate's process never let go of it in between (a candidate process alive
  without a hold could run work under someone else's timed calls).

The lock is a set of `flock`s per device in a lock dir shared by every kloop process of the
user on the host, whatever its cache dir (`isolation.host_lock_dir`; the device named after the
physical GPU, `state.gpu_lock_name`), released by the kernel when a holder dies. Every
acquisition opens its own file descriptions, so threads of one process exclude each other too.
Files: `.lock` (every holder: exclusive ones take it exclusively, the rest shared), `.writers`
(the gate: a holder about to need the device alone announces itself by a shared lock on it
before it waits; every other holder takes it exclusively, for an instant, before its share),
`.readers` (shared holders of kind `shared`; the candidate's upgrade takes it exclusively, so
it waits for them and keeps new ones out) and `.candidates` (a candidate exclusively, a
`shared_trusted` holder shared). A `.lock` share is never converted to exclusive: flock drops
the old lock before it grants the new one, and in that gap another holder could come in.

flock grants a lock compatible with the holders whatever waits, so the gate is what keeps a
stream of shared holders from keeping a timing waiting: shared holders queue until no holder
that needs the device alone waits, then go together (the outputs of several evaluations made
at once, in one gap between timings, or beside a candidate's trials).
CPU runs are not serialised: their host-clock timings are labelled not comparable anyway.
"""

from __future__ import annotations

import contextlib
import fcntl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Literal

HoldKind = Literal["exclusive", "shared", "shared_trusted", "candidate"]


class DeviceHold:
    """What a holder of the device lock holds; a `candidate` hold can become one alone."""

    def __init__(self, kind: HoldKind, writers: IO | None = None, readers: IO | None = None):
        self.kind = kind
        self._writers, self._readers = writers, readers
        self.alone = kind == "exclusive" or writers is None
        """No other process holds the device in any way (an exclusive hold, or an upgraded
        candidate's); on CPU (no lock files: nothing is locked), as it would be on a GPU."""

    def upgrade(self) -> float:
        """A candidate's hold made alone: waits for the shared holders beside it to end, keeping
        new ones out, never letting go of its own share. Returns the seconds waited; no-op
        (0.0) where the hold is alone already or never can be (trusted shared work)."""
        if self.alone or self.kind != "candidate":
            return 0.0
        t0 = time.monotonic()
        fcntl.flock(self._writers, fcntl.LOCK_SH)  # no new holder passes the gate
        fcntl.flock(self._readers, fcntl.LOCK_EX)  # the shared holders beside it are gone
        self.alone = True
        return time.monotonic() - t0


def _pass_gate(writers: IO) -> None:
    """Granted only while no holder that needs the device alone waits or holds."""
    fcntl.flock(writers, fcntl.LOCK_EX)
    fcntl.flock(writers, fcntl.LOCK_UN)


@contextlib.contextmanager
def device_lock(device: str, lock_dir: Path, kind: HoldKind = "exclusive"
                ) -> Iterator[DeviceHold]:
    """Hold `device` as `kind` says among every process and thread that names the same
    `lock_dir`."""
    if device == "cpu":
        yield DeviceHold(kind)
        return
    lock_dir.mkdir(parents=True, exist_ok=True)
    base = lock_dir / device.replace(":", "_")
    with open(f"{base}.lock", "a") as f, open(f"{base}.writers", "a") as w, \
            open(f"{base}.readers", "a") as r, open(f"{base}.candidates", "a") as c:
        if kind == "exclusive":
            fcntl.flock(w, fcntl.LOCK_SH)  # from now on, no new holder of another kind
            fcntl.flock(f, fcntl.LOCK_EX)
        else:
            if kind == "candidate":
                fcntl.flock(c, fcntl.LOCK_EX)  # one candidate at a time, no trusted start
            elif kind == "shared_trusted":
                fcntl.flock(c, fcntl.LOCK_SH)  # never beside a candidate
            _pass_gate(w)
            fcntl.flock(f, fcntl.LOCK_SH)
            if kind == "shared":
                fcntl.flock(r, fcntl.LOCK_SH)  # an upgrading candidate waits for it
        try:
            yield DeviceHold(kind, w, r)
        finally:
            for x in (r, f, w, c):
                fcntl.flock(x, fcntl.LOCK_UN)
