"""Triton's own runtime module, built once by trusted code and copied into every evaluation.

Triton's NVIDIA driver compiles a C module of its own (`cuda_utils`, from the `driver.c` it
ships) with the host compiler the first time a process uses it, and caches the result in
`TRITON_CACHE_DIR`. Every evaluation has a Triton cache of its own (no candidate may leave
anything for another), so every GPU candidate child used to run that compile, about half a
second of gcc, inside its first trial and so under the device lock.

Here a trusted child (no candidate code, no GPU use: building and loading the module needs
`libcuda.so`, not a device) builds it into the harness-private cache once per Triton version,
Python and platform, and each evaluation starts with a copy of it in its own Triton cache. A
candidate can change only its own copy. Where the build fails (no libcuda: a CPU host, where
Triton runs under the interpreter anyway), nothing is copied and Triton builds as it always did.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path

from kloop.evaluator.procs.isolation import private_dir

log = logging.getLogger(__name__)

_BUILD = (
    "from triton.backends.nvidia.driver import CudaUtils\n"
    "CudaUtils()\n"
)
_DONE = "built"
_TIMEOUT_S = 300.0
_lock = threading.Lock()
_failed: set[Path] = set()


def _version_tag() -> str:
    try:
        from importlib.metadata import version

        triton = version("triton")
    except Exception:
        triton = "unknown"
    return f"triton-{triton}-{sysconfig.get_config_var('EXT_SUFFIX') or sys.version_info[:2]}"


def runtime_dir(cache_dir: Path) -> Path:
    return private_dir(cache_dir) / "triton-runtime" / _version_tag().replace("/", "_")


def built_runtime(cache_dir: Path) -> Path | None:
    """The directory holding the built runtime module (a Triton cache tree), building it on
    first use; None where it cannot be built. One build per cache dir and version at a time in
    this process; a build that failed is not retried by this process."""
    final = runtime_dir(cache_dir)
    if (final / _DONE).exists():
        return final
    with _lock:
        if (final / _DONE).exists():
            return final
        if final in _failed:
            return None
        if _build(final):
            return final
        _failed.add(final)
        return None


def _build(final: Path) -> bool:
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="build-", dir=final.parent))
    cache = work / "cache"
    cache.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k in ("PATH", "CC", "LD_LIBRARY_PATH", "TRITON_LIBCUDA_PATH", "LANG")}
    env.update(TRITON_CACHE_DIR=str(cache), HOME=str(work), CUDA_VISIBLE_DEVICES="")
    try:
        p = subprocess.run([sys.executable, "-c", _BUILD], env=env, cwd=work, timeout=_TIMEOUT_S,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        ok = p.returncode == 0 and any(f.is_file() for f in cache.rglob("*"))
        if not ok:
            log.info("Triton's runtime module was not prebuilt (each candidate child builds "
                     "its own): %s", p.stdout[-500:])
            return False
        (cache / _DONE).write_text("")
        try:
            cache.rename(final)
        except OSError:  # another process got there first: its build serves as well
            return (final / _DONE).exists()
        return True
    except (OSError, subprocess.TimeoutExpired) as e:
        log.info("Triton's runtime module was not prebuilt: %s", e)
        return False
    finally:
        shutil.rmtree(work, ignore_errors=True)


def seed(cache_dir: Path, triton_cache: Path) -> int:
    """Copy the prebuilt runtime into an evaluation's own Triton cache (before its children
    start); returns how many files were copied (0: none built)."""
    source = built_runtime(cache_dir)
    if source is None:
        return 0
    copied = 0
    for path in source.rglob("*"):
        if not path.is_file() or path.name == _DONE:
            continue
        target = triton_cache / path.relative_to(source)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)  # a copy: a candidate may change its own, no one else's
        copied += 1
    return copied
