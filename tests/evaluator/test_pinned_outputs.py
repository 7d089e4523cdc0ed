"""Served outputs go to page-locked memory in both serving processes (`serve._pin`). The
reference worker runs as the harness (root: no locked-memory limit); a candidate child runs
under a uid without CAP_IPC_LOCK, held to RLIMIT_MEMLOCK (8 MiB on many hosts), so a
candidate whose outputs were larger paid pageable copies inside the clock that its baseline
did not. The harness raises the limit its children inherit (`isolation.allow_page_locked_
outputs`); here a candidate locks 64 MiB of its own memory, as `cudaHostRegister` would."""

from __future__ import annotations

import json
import resource

import pytest
from eval_helpers import candidate, cpu_config
from kloop.evaluator.harness.pipeline import evaluate
from kloop.evaluator.procs import isolation

LOCK = '''
import ctypes as _c, json as _j, mmap as _m, os as _o, resource as _r
def _lock(log):
    buf = _m.mmap(-1, 64 << 20)
    addr = _c.addressof(_c.c_char.from_buffer(buf))
    libc = _c.CDLL(None, use_errno=True)
    ok = libc.mlock(_c.c_void_p(addr), _c.c_size_t(64 << 20)) == 0
    with open(f"{log}.{_o.getpid()}.{_o.path.basename(_o.getcwd())}", "w") as f:
        f.write(_j.dumps({"locked": ok, "errno": _c.get_errno(),
                          "limit": _r.getrlimit(_r.RLIMIT_MEMLOCK)[0]}))
    if ok:
        libc.munlock(_c.c_void_p(addr), _c.c_size_t(64 << 20))
'''


def _raised() -> bool:
    isolation.allow_page_locked_outputs()
    soft = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    return soft == resource.RLIM_INFINITY or soft >= isolation.PAGE_LOCK_BYTES


@pytest.mark.skipif(not isolation.can_change_uid(), reason="needs a root harness")
@pytest.mark.skipif(not _raised(), reason="this host's root cannot raise RLIMIT_MEMLOCK "
                    "(no CAP_SYS_RESOURCE): `kloop check` says so")
def test_a_candidate_child_can_page_lock_large_outputs(tmp_path, drop_box):
    log = drop_box / "lock"
    src = candidate("mlp_torch.py").replace(
        "import torch.nn as nn", f"import torch.nn as nn\n{LOCK}\n_lock({str(log)!r})\n", 1)
    r = evaluate("L3/1", src, cpu_config(tmp_path / "cache"))
    assert r.status == "correct", r.error
    rows = [json.loads(f.read_text()) for f in drop_box.glob("lock.*")]
    assert rows and all(row["locked"] for row in rows), rows
    assert all(row["limit"] == resource.RLIM_INFINITY or row["limit"] >= isolation.PAGE_LOCK_BYTES
               for row in rows), rows


def test_raising_the_limit_keeps_a_higher_one():
    before = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    isolation.allow_page_locked_outputs()
    after = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    assert after[0] == resource.RLIM_INFINITY or after[0] >= min(
        isolation.PAGE_LOCK_BYTES, before[1] if before[1] != resource.RLIM_INFINITY else 1 << 62)
    assert after[1] == resource.RLIM_INFINITY or after[1] >= before[1]
