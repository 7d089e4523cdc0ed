"""`kloop check`: what isolation and measurement this machine gives the evaluator, before an
experiment runs on it. Each row says whether the protection is in place here and, when not,
why; the rows marked `trust` must all hold for results to be free of `isolation_same_uid`.

`probe` does not take the configuration's word for it: it evaluates a candidate that reports,
from inside the candidate process, the identity, capabilities, processes, directories and
environment it was given, and checks each against what the sandbox promises."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from kloop.evaluator.common.config import EvalConfig
from kloop.evaluator.procs import devicepool, isolation
from kloop.evaluator.procs.buildslots import default_slots


class CheckRow(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str
    ok: bool | None
    """None: does not apply here (e.g. NVML on a machine without a GPU)."""
    trust: bool
    """Whether results depend on it for their isolation (the rest is measurement or speed)."""
    detail: str


def _profiling_admin_only() -> bool | None:
    try:
        text = Path("/proc/driver/nvidia/params").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("RmProfilingAdminOnly:"):
            return line.split(":")[1].strip() != "0"
    return None


def rows(config: EvalConfig, problem_path: Path) -> list[CheckRow]:
    root = isolation.can_change_uid()
    out = [CheckRow(name="harness identity", ok=root, trust=True,
                    detail="root: candidates can get another uid and namespaces" if root else
                    f"uid {os.geteuid()}: candidate code runs under this uid "
                    "(run as root, e.g. in a container, for the sandbox)")]
    try:
        devices = devicepool.pool(config.device)
    except RuntimeError as e:
        devices = []
        out.append(CheckRow(name="devices", ok=False, trust=False, detail=str(e)))
    else:
        out.append(CheckRow(name="devices", ok=True, trust=False, detail=", ".join(devices)))
    on_gpu = any(d != "cpu" for d in devices)
    plan = isolation.plan_sandbox(config.sandbox_uid, on_gpu, problem_path)
    out.append(CheckRow(
        name="sandbox uid", ok=not plan.same_uid, trust=True,
        detail=(f"uids {config.sandbox_uid}.. (one per evaluation in flight)" if not plan.same_uid
                else f"none: {plan.reason}"
                + ("; root without capabilities instead" if plan.drop_caps else "")
                + ("; put kloop and its Python where every uid can read them (e.g. /opt)"
                   if "cannot reach" in plan.reason else ""))))
    _, contained = isolation.work_parent(config.work_root)
    userns = contained and not isolation.can_change_uid()
    out.append(CheckRow(
        name="containment", ok=contained, trust=True,
        detail="mount, PID, network and IPC namespaces: own evaluation dir only, shared scratch "
        "read-only" + ("; through a user namespace, the rest of the file tree read-only"
                       if userns else "")
        if contained else "needs a root harness or unprivileged user namespaces"))
    private = isolation.private_dir(config.cache_dir)
    st = private.stat()
    sealed = st.st_uid == isolation.VAULT_UID and st.st_mode & 0o077 == 0
    out.append(CheckRow(name="private cache", ok=sealed or userns, trust=True,
                        detail=f"{private}" + ("" if sealed else
                                               ": hidden from contained children" if userns else
                                               ": writable by candidate code")))
    if on_gpu:
        from kloop.evaluator.harness import gpustate
        from kloop.evaluator.procs.sandbox import visible_device

        s = gpustate.sample(visible_device(devices[0]))
        out.append(CheckRow(name="NVML", ok=s is not None, trust=False,
                            detail=f"SM clock {s.sm_clock_mhz} MHz" if s else
                            "no readings: gpu_throttled/gpu_clock_differs cannot be flagged"))
        ncu, admin = shutil.which("ncu"), _profiling_admin_only()
        out.append(CheckRow(
            name="ncu", ok=bool(ncu) and admin is False, trust=False,
            detail="not installed" if not ncu else
            "counters restricted to administrators: results would say ncu_unavailable"
            if admin else f"{ncu}"))
    else:
        out.append(CheckRow(name="NVML", ok=None, trust=False, detail="no GPU"))
    out.append(_page_lock_row())
    out.append(CheckRow(name="build slots", ok=True, trust=False,
                        detail=str(config.build_slots or default_slots())))
    out.append(_lock_row())
    out.append(_quiet_row())
    out.append(_ahead_row(config))
    out.append(_lean_row(config, on_gpu))
    return out


def _lock_row() -> CheckRow:
    """Where the device lock's files live (`isolation.host_lock_dir`): every kloop process of
    this user on this host waits there for the others; a dir that is not ours stops every GPU
    evaluation."""
    try:
        where = isolation.host_lock_dir()
    except RuntimeError as e:
        return CheckRow(name="device lock", ok=False, trust=False, detail=str(e))
    return CheckRow(name="device lock", ok=True, trust=False, detail=f"host-wide: {where}")


def _lean_row(config: EvalConfig, on_gpu: bool) -> CheckRow:
    """Whether a torch-free `.cu` can build lean here (`evaluator.build.lean`): the headers
    outside torch that `<torch/types.h>` includes, found by nvcc's preprocessor as a build
    finds them. Speed only: without them every CUDA build takes the plain way (~40 s)."""
    import tempfile
    import time

    from kloop.evaluator.build import lean

    if config.lean_cuda == "off":
        return CheckRow(name="lean CUDA builds", ok=None, trust=False, detail="off (lean_cuda)")
    if not on_gpu:
        return CheckRow(name="lean CUDA builds", ok=None, trust=False,
                        detail="no GPU: CUDA candidates are only compile-checked here")
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return CheckRow(name="lean CUDA builds", ok=False, trust=False, detail="no nvcc on PATH")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kloop-check-lean-") as tmp:
        found = lean.facts(nvcc, [*lean.torch_nvcc_flags(), "-c", "x.cu", "-o", "x.o"], "x.cu",
                           Path(tmp))
    if found is None:
        return CheckRow(name="lean CUDA builds", ok=False, trust=False,
                        detail="nvcc's preprocessor could not list the headers <torch/types.h> "
                        "includes: every CUDA build takes the plain way (~40 s)")
    return CheckRow(name="lean CUDA builds", ok=True, trust=False,
                    detail=f"a torch-free .cu builds with {len(found.headers)} headers in place "
                    f"of <torch/types.h> (found in {time.monotonic() - t0:.1f} s); one that "
                    "names torch builds the plain way")


def _ahead_row(config: EvalConfig) -> CheckRow:
    """Whether candidate children build their models before the device lock (`construct_at`):
    speed only; where they cannot, they build under it as before."""
    if config.construct_at == "under_lock":
        return CheckRow(name="build ahead", ok=None, trust=False, detail="off (under_lock)")
    able = isolation.can_grant()
    missing = [name for name, cap in (("SYS_ADMIN", isolation.CAP_SYS_ADMIN),
                                      ("SYS_CHROOT", isolation.CAP_SYS_CHROOT),
                                      ("SYS_PTRACE", isolation.CAP_SYS_PTRACE),
                                      ("SYS_NICE", isolation.CAP_SYS_NICE))
               if not isolation.has_capabilities(cap)]
    return CheckRow(
        name="build ahead", ok=able, trust=False,
        detail="models built before the device lock, the device hidden until it is held" if able
        else "models built under the device lock: " + (
            "not root" if not isolation.can_change_uid() else
            f"the harness lacks {', '.join(missing)}" if missing else "a user namespace"))


def _quiet_row() -> CheckRow:
    """Where timed work runs (`evaluator.harness.cores`): cores of its own, or anywhere."""
    from kloop.evaluator.harness import cores

    q = cores.plan()
    if q is None:
        return CheckRow(name="quiet cores", ok=None, trust=False,
                        detail=f"none: fewer than {cores.MIN_CORES} cores, timed work shares them")
    return CheckRow(name="quiet cores", ok=True, trust=False,
                    detail=f"timing thread on {q.timer}, served processes on "
                    f"{sorted(q.serving)}, builds and children before the lock on the "
                    f"other {len(q.rest)}")


def _page_lock_row() -> CheckRow:
    """Whether candidate children can page-lock their served outputs as the reference worker
    does (`isolation.allow_page_locked_outputs`); without it, a candidate with outputs past the
    limit pays pageable copies inside the clock that its baseline does not."""
    import resource

    isolation.allow_page_locked_outputs()
    soft = resource.getrlimit(resource.RLIMIT_MEMLOCK)[0]
    big = soft == resource.RLIM_INFINITY or soft >= isolation.PAGE_LOCK_BYTES
    shown = "unlimited" if soft == resource.RLIM_INFINITY else f"{soft >> 20} MiB"
    return CheckRow(name="page-locked outputs", ok=big, trust=False,
                    detail=f"children may lock {shown}" + ("" if big else
                    ": outputs larger than that are copied pageable inside the clock (give the "
                    "harness CAP_SYS_RESOURCE or a higher memlock limit)"))


PROBE = '''"""kloop check's probe: reports what candidate code sees, from inside its process."""
import json
import os
import socket


def _writable(d):
    path = os.path.join(d, f".kloop-probe-{os.getpid()}")
    try:
        open(path, "w").close()
        os.unlink(path)
        return True
    except OSError:
        return False


def _route_out():
    k = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        k.connect(("192.0.2.1", 9))  # UDP: no packet is sent, only a route is looked up
        return True
    except OSError:
        return False
    finally:
        k.close()


def _secret_readable():
    try:
        with open("/etc/shadow", "rb") as f:
            return bool(f.read(1))
    except OSError:
        return False


def _facts():
    status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    parent = os.path.dirname(os.path.dirname(os.getcwd()))
    try:
        work = sorted(os.listdir(parent))
    except OSError as e:
        work = f"not listable (errno {e.errno})"
    return {"uid": os.getuid(), "cap_eff": status["CapEff"].strip(),
            "no_new_privs": status["NoNewPrivs"].strip(), "pid": os.getpid(),
            "processes": sum(p.isdigit() for p in os.listdir("/proc")), "work": work,
            "tmp_writable": _writable("/tmp"), "home": os.environ.get("HOME", ""),
            "stdlib_writable": _writable(os.path.dirname(os.__file__)),
            "route_out": _route_out(), "interfaces": [n for _, n in socket.if_nameindex()],
            "cwd": os.getcwd(), "env": sorted(os.environ),
            "shadow_readable": _secret_readable()}


class ModelNew:  # never built: constructing it reports what the candidate process sees
    def __init__(self, *args, **kwargs):
        # Into its own dir (kept for the harness to read): error text reaches a result cut.
        with open("probe.json", "w") as f:
            json.dump(_facts(), f)
        raise RuntimeError("KLOOP-PROBE")
'''

def probe(config: EvalConfig, problem_id: str = "L3/1") -> list[CheckRow]:
    """One evaluation of `PROBE` on the CPU, under this config's sandbox; rows from what it saw."""
    from kloop.evaluator.harness.pipeline import evaluate
    from kloop.evaluator.procs.sandbox import SECRET_NAME

    with tempfile.TemporaryDirectory(prefix="kloop-check-") as work:
        cfg = config.model_copy(update={"device": "cpu", "policy": "kernelbench",
                                        "baselines": "none", "profile": False,
                                        "work_root": Path(work), "keep_workdir": True})
        r = evaluate(problem_id, PROBE, cfg)
        reports = list(Path(work).glob("*/kloop-eval-*/cand/probe.json"))
        text = reports[0].read_text() if len(reports) == 1 else ""
    if not text:
        said = r.error.message if r.error is not None else ""
        return [CheckRow(name="probe", ok=False, trust=True,
                         detail=f"the probe did not report ({r.status}: {said[:200]})")]
    seen = json.loads(text)
    me = os.geteuid()
    other_uid = seen["uid"] != me
    no_caps = int(seen["cap_eff"], 16) == 0
    alone = isinstance(seen["work"], list) and len(seen["work"]) == 1
    secrets = [k for k in seen["env"] if SECRET_NAME.search(k)]
    home_own = seen["home"].startswith(os.path.dirname(seen["cwd"]))
    return [
        CheckRow(name="probe: identity", ok=other_uid or no_caps, trust=True,
                 detail=f"uid {seen['uid']}, capabilities {seen['cap_eff']}"
                 + ("" if other_uid else " (the harness's uid)")),
        CheckRow(name="probe: no_new_privs", ok=seen["no_new_privs"] == "1", trust=True,
                 detail=seen["no_new_privs"]),
        CheckRow(name="probe: other evaluations", ok=alone or not isinstance(seen["work"], list),
                 trust=True, detail=f"work dir shows {seen['work']}"),
        CheckRow(name="probe: other processes", ok=seen["pid"] == 1, trust=True,
                 detail=f"pid {seen['pid']}, {seen['processes']} processes visible"),
        CheckRow(name="probe: shared scratch", ok=not seen["tmp_writable"], trust=True,
                 detail="/tmp writable" if seen["tmp_writable"] else "/tmp read-only"),
        CheckRow(name="probe: network", ok=not seen["route_out"], trust=True,
                 detail=f"interfaces {', '.join(seen['interfaces']) or 'none'}; "
                 + ("a route out" if seen["route_out"] else "no route out")),
        CheckRow(name="probe: file tree", ok=not seen["stdlib_writable"], trust=True,
                 detail="Python's own library writable" if seen["stdlib_writable"] else
                 "read-only outside its evaluation's dir and cache"),
        CheckRow(name="probe: environment", ok=not secrets and home_own, trust=True,
                 detail=f"{len(seen['env'])} variables"
                 + (f"; credential-like: {', '.join(secrets)}" if secrets else "")
                 + ("" if home_own else f"; HOME {seen['home']} outside its dir")),
        CheckRow(name="probe: host files", ok=not seen["shadow_readable"], trust=True,
                 detail="/etc/shadow readable" if seen["shadow_readable"] else
                 "/etc/shadow unreadable or covered"),
    ]
