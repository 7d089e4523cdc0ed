"""Contained children (a root harness) share no network and no System V IPC with the host:
nothing listening there (a local service, a cluster's head node, another evaluation's
candidate) can be reached from candidate code, and nothing can be sent out. The probe below
reaches all three from a plain process (the control) and none from a candidate child."""

from __future__ import annotations

import ctypes
import socket
import subprocess
import sys
import uuid

import pytest
from eval_helpers import candidate, cpu_config, drop_rows
from kloop.evaluator.harness.pipeline import evaluate
from kloop.evaluator.procs import isolation

PROBE = '''
import ctypes as _c, json as _j, os as _o, socket as _s
def _reach(log, port, abstract, key):
    seen = {}
    for name, fam, addr in (("tcp", _s.AF_INET, ("127.0.0.1", port)),
                            ("abstract", _s.AF_UNIX, abstract)):
        k = _s.socket(fam, _s.SOCK_STREAM)
        k.settimeout(2)
        try:
            k.connect(addr)
            seen[name] = True
        except OSError:
            seen[name] = False
        finally:
            k.close()
    libc = _c.CDLL(None, use_errno=True)
    seen["sysv"] = libc.shmget(key, 0, 0) >= 0
    with open(f"{log}.{_o.getpid()}.{_o.path.basename(_o.getcwd())}", "w") as f:
        f.write(_j.dumps(seen) + "\\n")
'''


@pytest.fixture
def listeners():
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(16)
    abstract = "\0kloop-test-" + uuid.uuid4().hex
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(abstract)
    unix.listen(16)
    libc = ctypes.CDLL(None, use_errno=True)
    key = int(uuid.uuid4().int & 0x3FFFFFFF)
    shmid = libc.shmget(key, 4096, 0o1000 | 0o666)  # IPC_CREAT
    assert shmid >= 0
    yield tcp.getsockname()[1], abstract, key
    libc.shmctl(shmid, 0, None)  # IPC_RMID
    tcp.close()
    unix.close()


def _call(log, port, abstract, key) -> str:
    return f"_reach({str(log)!r}, {port}, {abstract!r}, {key})\n"


def test_the_probe_reaches_everything_from_a_plain_process(drop_box, listeners):
    log = drop_box / "plain"
    subprocess.run([sys.executable, "-c", PROBE + _call(log, *listeners)], check=True,
                   timeout=60, cwd=drop_box)
    assert drop_rows(log) == [{"tcp": True, "abstract": True, "sysv": True}]


@pytest.mark.skipif(not isolation.can_change_uid(), reason="needs a root harness")
def test_candidate_code_reaches_no_listener_and_no_ipc_of_the_host(tmp_path, drop_box,
                                                                   listeners):
    log = drop_box / "seen"
    src = candidate("mlp_torch.py").replace(
        "import torch.nn as nn", f"import torch.nn as nn\n{PROBE}\n{_call(log, *listeners)}", 1)
    r = evaluate("L3/1", src, cpu_config(tmp_path / "cache"))
    assert r.status == "correct", r.error
    rows = drop_rows(log)
    assert rows, "the probe never ran"
    assert all(row == {"tcp": False, "abstract": False, "sysv": False} for row in rows), rows
