"""The trusted builder of the precompiled torch header that `load_inline`'s binding file uses
(`evaluator.build.cxx_pch` is the compiler side).

A PCH is made only by trusted code, from fixed text (`#include <torch/extension.h>`), under flags
torch itself chose: for each variant (CUDA or not, and the extra C++ flags of the common calls:
none, `-O3`) a probe `load_inline` of an empty extension runs with `cxx_pch` in capture mode,
which records the binding compile's exact flags and key and stops the build. No candidate's flags
are ever compiled here: a candidate with other flags simply finds no PCH and builds the plain way.
The store is a directory every sandbox uid can read and none can write: `<tmp>/kloop-pch-<uid>`,
made by this uid with mode 0755 and refused if someone else made it or can write it (`KLOOP_PCH_
DIR` moves it); under a root harness it and everything in it belong to the vault uid, so not even
a child that is root without capabilities owns anything there (contained children also see the
tree read-only). Entries appear by one rename, complete, with a `ready` marker last; about 0.8 GB
and ~30 s of one core each (H200 host; ~50 s on a 2-core CI host).

`ensure_async` starts the missing builds in a background thread (once per process); a build that
finds no PCH meanwhile runs the plain way. Nothing here is on a result's critical path.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import NamedTuple

from kloop.evaluator.build import cxx_pch
from kloop.evaluator.common.vault import VAULT_UID

log = logging.getLogger(__name__)

DIR_ENV = "KLOOP_PCH_DIR"
LAUNCHER = "kloop-g++"
"""The name torch sees as its compiler (its check accepts names with `g++` in them)."""
_TIMEOUT_S = 900.0
_STALE_S = 4 * 3600.0
_PROBE = r"""
import json, sys, tempfile
from torch.utils.cpp_extension import load_inline
with_cuda, flags = json.loads(sys.argv[1])
with tempfile.TemporaryDirectory() as d:
    try:
        load_inline("kloop_pch_probe", cpp_sources="", build_directory=d, with_cuda=with_cuda,
                    extra_cflags=flags, verbose=False)
    except Exception:
        pass  # the capture stops the build
"""


class Variant(NamedTuple):
    with_cuda: bool
    extra_cflags: tuple[str, ...] = ()


def default_variants(cuda: bool) -> list[Variant]:
    """What most `load_inline` calls pass: no extra C++ flags, or `-O3`."""
    return [Variant(cuda, ()), Variant(cuda, ("-O3",))]


def store_dir() -> Path | None:
    """The PCH store, made if missing; None where it cannot be trusted (made by someone else,
    or writable by others)."""
    default = Path(tempfile.gettempdir()) / f"kloop-pch-{os.geteuid()}"
    path = Path(os.environ.get(DIR_ENV) or default)
    owner = VAULT_UID if os.geteuid() == 0 else os.geteuid()
    try:
        made = not path.exists()
        path.mkdir(parents=True, mode=0o755, exist_ok=True)
        if made and owner != os.geteuid():
            os.chown(path, owner, owner, follow_symlinks=False)
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != owner or stat.S_IMODE(st.st_mode) & 0o022:
        log.warning("%s is not this uid's alone: no precompiled headers", path)
        return None
    return path


def ready_keys(root: Path) -> list[str]:
    try:
        return sorted(p.name for p in root.iterdir() if (p / cxx_pch.READY).is_file())
    except OSError:
        return []


def launcher(work: Path) -> Path:
    """A compiler torch can run (one executable path) that is `cxx_pch` under this Python."""
    path = work / LAUNCHER
    path.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} "
                    f'{shlex.quote(cxx_pch.__file__)} "$@"\n')
    path.chmod(0o755)
    return path


def _idle_build(root: Path, variant: Variant) -> None:
    """`build` in a thread of its own that runs SCHED_IDLE, like compile children (a Linux
    policy is per thread and the processes a thread starts inherit it): no CPU time a timed
    process wants goes to a PCH."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        pass
    build(root, variant)


def compiler_env(work: Path, root: Path | None, report: Path) -> dict[str, str]:
    """The environment of one `load_inline` build that goes through `cxx_pch` (`CXX` and what
    it reads); empty without a store."""
    if root is None or shlex.quote(str(work)) != str(work):
        return {}  # torch's build.ninja names its compiler unquoted: a plain build there
    return {**_wrapped(work), cxx_pch.ROOT_ENV: str(root), cxx_pch.REPORT_ENV: str(report)}


def _wrapped(work: Path) -> dict[str, str]:
    """`CXX` is `cxx_pch`, which runs the compiler torch would have run."""
    return {"CXX": str(launcher(work)), cxx_pch.REAL_ENV: os.environ.get("CXX") or "c++"}


class Probe(NamedTuple):
    cxx: str
    flags: list[str]
    key: str


def probe(variant: Variant, work: Path) -> Probe | None:
    """The binding compile's compiler, flags and key for `variant`, as torch runs it."""
    capture = work / "capture.json"
    env = {**os.environ, **_wrapped(work), cxx_pch.CAPTURE_ENV: str(capture)}
    env.pop(cxx_pch.ROOT_ENV, None)
    r = subprocess.run([sys.executable, "-c", _PROBE,
                        json.dumps([variant.with_cuda, list(variant.extra_cflags)])],
                       env=env, cwd=work, capture_output=True, text=True, timeout=300)
    if not capture.is_file():
        log.info("PCH probe %s captured nothing: %s", variant, r.stderr[-1000:])
        return None
    got = json.loads(capture.read_text())
    return Probe(got["cxx"], got["flags"], got["key"])


def build(root: Path, variant: Variant) -> str | None:
    """Make `variant`'s PCH in `root` unless it is there; its key, or None where it cannot be
    made (no compiler, a probe that captured nothing). One builder per variant at a time across
    processes (a lock file); a second one waits and then finds it."""
    tag = "-".join(["cuda" if variant.with_cuda else "cpu", *variant.extra_cflags]) or "x"
    return _locked(root, tag, lambda work: _build_locked(root, variant, work))


def _locked(root: Path, tag: str, make) -> str | None:
    lock_path = root / f".lock-{''.join(c if c.isalnum() or c in '-_' else '_' for c in tag)}"
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _clean_stale(root)
        work = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
        try:
            return make(work)
        finally:
            shutil.rmtree(work, ignore_errors=True)


# ---- the compile check's PCH (hosts without a GPU) -------------------------------------------
# Where no GPU is there to build for, a CUDA candidate is compile-checked instead
# (`evaluator.build.nvcc.nvcc_check`): g++ -fsyntax-only over load_inline's main.cpp, whose first
# line is `#include <torch/extension.h>`, beside nvcc over the .cu. That g++ pass is most of a
# check's CPU time (17 s of 27 s for the prompt's lean form on a 2-core host, 5 s with this PCH;
# the PCH itself takes 36 s once). The entry has the layout of a `load_inline` one, under the
# check's own flags (`nvcc.check_gxx_flags`), which nvcc_check offers with `-I` exactly as
# `cxx_pch` does: g++ takes it where valid and reads the forwarding header otherwise.


def check_probe() -> Probe:
    from kloop.evaluator.build import nvcc

    flags = nvcc.check_gxx_flags()
    return Probe(nvcc.CHECK_CXX, flags, cxx_pch.pch_key(nvcc.CHECK_CXX, flags))


def build_check(root: Path) -> str | None:
    """The compile check's PCH in `root` unless it is there (one builder at a time); its key."""
    return _locked(root, "check", lambda work: _make(root, check_probe(), work, "the compile check"))


def _check_in_background() -> None:
    root = store_dir()
    if root is not None:
        build_check(root)


_check_started = threading.Event()


def ensure_check_async() -> None:
    """`build_check` in a background thread, once per process. At the usual priority, unlike
    the GPU host's builds: a host without a GPU times nothing of record, and at SCHED_IDLE a
    build on a host kept busy (CI's two cores under two test workers) would never finish."""
    with _started_lock:
        if _check_started.is_set():
            return
        _check_started.set()
    threading.Thread(target=_check_in_background, daemon=True, name="kloop-pch-check").start()


def _clean_stale(root: Path) -> None:
    """Work dirs of builders killed half-way (a build takes minutes at most)."""
    for old in root.glob(".build-*"):
        try:
            if time.time() - old.stat().st_mtime > _STALE_S:
                shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass


def _build_locked(root: Path, variant: Variant, work: Path) -> str | None:
    got = probe(variant, work)
    if got is None:
        return None
    return _make(root, got, work, variant)


def _make(root: Path, got: Probe, work: Path, what: object) -> str | None:
    """The entry of `got`'s compiler and flags in `root` (under the caller's lock), unless it is
    there; its key, or None where g++ failed."""
    final = root / got.key
    if (final / cxx_pch.READY).is_file():
        return got.key
    entry = work / "entry"
    header = entry / cxx_pch.HEADER
    header.parent.mkdir(parents=True)
    header.write_text(cxx_pch.FORWARD)
    t0 = time.monotonic()
    # The forwarding header compiled as the main file: its `#include_next` acts as `#include`
    # (g++ says so in a warning), i.e. the real header through torch's include path.
    r = subprocess.run([*shlex.split(got.cxx), *got.flags, "-x", "c++-header", str(header), "-o",
                        str(header) + ".gch"], cwd=work, capture_output=True, text=True,
                       timeout=_TIMEOUT_S)
    if r.returncode != 0:
        log.warning("PCH for %s not built: %s", what, r.stderr[-2000:])
        return None
    (entry / "flags.json").write_text(json.dumps(
        {"cxx": got.cxx, "flags": got.flags, "variant": str(what), "seconds":
         round(time.monotonic() - t0, 1)}))
    (entry / cxx_pch.READY).write_text("")
    owner = os.lstat(root).st_uid
    for path in [entry, *entry.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
        if owner != os.geteuid():
            os.chown(path, owner, owner, follow_symlinks=False)
    shutil.rmtree(final, ignore_errors=True)  # a half-made one from a killed builder
    os.rename(entry, final)
    log.info("precompiled torch header for %s built in %.1f s", what, time.monotonic() - t0)
    return got.key


def ensure(variants: list[Variant]) -> list[str]:
    """Build every missing variant now (in parallel); the keys that are ready."""
    root = store_dir()
    if root is None:
        return []
    threads = [threading.Thread(target=_idle_build, args=(root, v), daemon=True)
               for v in variants]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return ready_keys(root)


_started: set[tuple[Variant, ...]] = set()
_started_lock = threading.Lock()


def ensure_async(variants: list[Variant]) -> None:
    """`ensure` in a background thread, once per process and set of variants."""
    with _started_lock:
        if tuple(variants) in _started:
            return
        _started.add(tuple(variants))
    threading.Thread(target=ensure, args=(variants,), daemon=True, name="kloop-pch").start()
