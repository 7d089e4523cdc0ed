"""Registers, spills and shared memory per kernel, from `ptxas -v` output or a cubin."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from kloop.evaluator.common.result import KernelResources

_ENTRY = re.compile(r"ptxas info\s*: (?:Compiling entry function|Function properties for) '?([^'\s]+)'?")
_SPILL = re.compile(r"(\d+) bytes spill stores")
_USED = re.compile(r"ptxas info\s*: Used (\d+) registers(?:.*?(\d+) bytes smem)?")
_RES_FN = re.compile(r"^\s*Function ([^:\s]+):")
_RES_VALS = re.compile(r"REG:(\d+).*?SHARED:(\d+).*?LOCAL:(\d+)")


def demangle(symbols: list[str]) -> dict[str, str]:
    """Mangled C++ name -> bare function name (no namespace, template args or parameters)."""
    out = {s: s for s in symbols}
    cxxfilt = shutil.which("c++filt")
    if not symbols or cxxfilt is None:
        return out
    try:
        res = subprocess.run([cxxfilt, *symbols], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return out
    for sym, pretty in zip(symbols, res.stdout.splitlines(), strict=False):
        out[sym] = bare_name(pretty)
    return out


def _strip_trailing_group(text: str, open_ch: str, close_ch: str) -> str:
    """Remove a balanced `(...)`/`<...>` group that ends the text."""
    if not text.endswith(close_ch):
        return text
    depth = 0
    for i in range(len(text) - 1, -1, -1):
        if text[i] == close_ch:
            depth += 1
        elif text[i] == open_ch:
            depth -= 1
            if depth == 0:
                return text[:i].rstrip()
    return text


def bare_name(pretty: str) -> str:
    """`void ns::k<float>(float*, int)` -> `k`; Triton/plain names are returned unchanged."""
    head = _strip_trailing_group(pretty.strip(), "(", ")")
    head = _strip_trailing_group(head, "<", ">")
    last = head.split("::")[-1].split()
    return last[-1] if last else pretty


def parse_ptxas_verbose(text: str) -> list[KernelResources]:
    """Per-kernel resources from the `-Xptxas -v` lines of an nvcc log."""
    found: dict[str, dict[str, int | None]] = {}
    current: str | None = None
    for line in text.splitlines():
        m = _ENTRY.search(line)
        if m:
            current = m.group(1)
            found.setdefault(current, {})
            continue
        if current is None:
            continue
        s = _SPILL.search(line)
        if s:
            found[current]["spill_bytes"] = int(s.group(1))
        u = _USED.search(line)
        if u:
            found[current]["registers"] = int(u.group(1))
            found[current]["shared_bytes"] = int(u.group(2)) if u.group(2) else 0
    names = demangle(list(found))
    return [KernelResources(kernel=names[k], **v) for k, v in found.items()]  # type: ignore[arg-type]


def cuobjdump_tool() -> str | None:
    """The cuobjdump bundled with Triton's NVIDIA backend, else the one on PATH."""
    try:
        import triton.backends.nvidia as nv

        bundled = Path(nv.__file__).parent / "bin" / "cuobjdump"
        if bundled.is_file():
            return str(bundled)
    except ImportError:
        pass
    return shutil.which("cuobjdump")


def cubin_resources(cubin: bytes, work_dir: Path) -> list[KernelResources]:
    """Resources of every function in a cubin (`cuobjdump -res-usage`); [] if the tool is absent."""
    tool = cuobjdump_tool()
    if tool is None:
        return []
    work_dir.mkdir(parents=True, exist_ok=True)
    path = work_dir / "kernel.cubin"
    path.write_bytes(cubin)
    try:
        res = subprocess.run([tool, "-res-usage", str(path)], capture_output=True, text=True,
                             timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    out: list[KernelResources] = []
    name: str | None = None
    for line in res.stdout.splitlines():
        m = _RES_FN.match(line)
        if m:
            name = m.group(1)
            continue
        v = _RES_VALS.search(line)
        if v and name is not None:
            out.append(KernelResources(kernel=name, registers=int(v.group(1)),
                                       shared_bytes=int(v.group(2)), local_bytes=int(v.group(3))))
            name = None
    names = demangle([r.kernel for r in out])
    return [r.model_copy(update={"kernel": names[r.kernel]}) for r in out]
