"""Compiler output -> deduplicated `CompileDiagnostic`s that point into the candidate's own file.

`load_inline` writes the candidate's strings into `main.cpp` and `cuda.cu` after a few implicit
`#include` lines, so nvcc's `cuda.cu(12)` is not a line the model ever saw. A `SourceMap` maps
lines of such a generated file back to the candidate `.py` file (or, failing that, to the line
within the string it came from).
"""

from __future__ import annotations

import ast
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from kloop.evaluator.common.result import CompileDiagnostic, CompileLog

LOG_TAIL_BYTES = 4096

# nvcc/EDG: `path/cuda.cu(12): error: msg` (also `warning #550-D:`, `catastrophic error:`)
_EDG = re.compile(
    r"^(?P<file>[^\s()][^()]*?)\((?P<line>\d+)\):\s*(?P<sev>catastrophic error|error|warning)"
    r"(?:\s*#[\w-]+)?\s*:\s*(?P<msg>.*)$"
)
# gcc/g++/clang: `path/main.cpp:3:5: error: msg` (column optional)
_GCC = re.compile(
    r"^(?P<file>[^\s:][^:]*):(?P<line>\d+):(?:(?P<col>\d+):)?\s*(?P<sev>fatal error|error|warning)"
    r":\s*(?P<msg>.*)$"
)
# Diagnostics without a location: ptxas, nvcc fatal, the linker, a failed import.
_BARE = [
    re.compile(r"^ptxas (?P<sev>error|fatal)\s*:\s*(?P<msg>.*)$"),
    re.compile(r"^nvcc (?P<sev>fatal|error)\s*:\s*(?P<msg>.*)$"),
    re.compile(r"^(?:/\S*/)?ld(?:\.\w+)?: (?P<msg>(?:cannot find|.*undefined reference).*)$"),
    re.compile(r"^(?:ImportError|OSError): (?P<msg>.*undefined symbol: .*)$"),
]
_UNDEFINED_SYMBOL = re.compile(r"undefined symbol: (\S+)")


@dataclass(frozen=True)
class Segment:
    """One candidate string inside a generated file."""

    first_line: int
    """1-based line of the generated file on which the string's first line lands."""
    n_lines: int
    label: str
    """What the string was, e.g. `cuda_sources`."""
    origin_line: int | None = None
    """1-based line in the candidate file where the string's first line is, when found."""


@dataclass
class SourceMap:
    """Maps lines of one generated file (e.g. `cuda.cu`) back to the candidate."""

    generated_name: str
    candidate_name: str | None
    segments: list[Segment] = field(default_factory=list)

    def resolve(self, line: int) -> tuple[str, int] | None:
        """(file, line) the model can act on, or None for lines the candidate did not write."""
        for seg in self.segments:
            if seg.first_line <= line < seg.first_line + seg.n_lines:
                offset = line - seg.first_line
                if seg.origin_line is not None and self.candidate_name:
                    return self.candidate_name, seg.origin_line + offset
                return seg.label, offset + 1
        return None


def locate_string(candidate_source: str | None, value: str) -> int | None:
    """Line in the candidate file where the string literal with exactly this value starts."""
    if not candidate_source:
        return None
    try:
        tree = ast.parse(candidate_source)
    except SyntaxError:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and node.value == value:
            return node.lineno
    return None


def build_source_map(
    generated_name: str,
    prefix_lines: int,
    parts: Sequence[tuple[str, str]],
    candidate_source: str | None = None,
    candidate_name: str | None = None,
) -> SourceMap:
    """SourceMap for a file written as `prefix_lines` lines, then `"\\n".join` of `parts`.

    `parts` are (label, text) pairs in file order, as load_inline joins its source lists.
    """
    smap = SourceMap(generated_name=generated_name, candidate_name=candidate_name)
    line = prefix_lines + 1
    for label, text in parts:
        n = text.count("\n") + 1
        smap.segments.append(Segment(line, n, label, locate_string(candidate_source, text)))
        line += n
    return smap


def _short_path(path: str) -> str:
    parts = Path(path).parts
    return "/".join(parts[-3:]) if len(parts) > 3 else path


def _demangle(symbol: str) -> str:
    try:
        out = subprocess.run(["c++filt", symbol], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return symbol
    return out.stdout.strip() or symbol


def _severity(raw: str) -> Literal["error", "warning"]:
    return "warning" if raw == "warning" else "error"


def _located(
    m: re.Match[str], source_file_map: Mapping[str, SourceMap]
) -> tuple[CompileDiagnostic, bool]:
    """A diagnostic from a file:line match, and whether it points into candidate code."""
    path, line = m.group("file").strip(), int(m.group("line"))
    col = m.groupdict().get("col")
    msg = m.group("msg").strip()
    smap = source_file_map.get(Path(path).name)
    resolved = smap.resolve(line) if smap else None
    if resolved is not None:
        file, line_out = resolved
        if file != Path(path).name:
            msg = f"{msg} [{Path(path).name}:{line}]"
        return CompileDiagnostic(
            file=file, line=line_out, column=int(col) if col else None,
            severity=_severity(m.group("sev")), message=msg,
        ), True
    return CompileDiagnostic(
        file=smap.generated_name if smap else _short_path(path), line=line,
        column=int(col) if col else None,
        severity=_severity(m.group("sev")), message=msg,
    ), smap is None and not path.startswith("/")


def _parse_line(
    raw: str, source_file_map: Mapping[str, SourceMap]
) -> CompileDiagnostic | None:
    # gcc quotes with ‘…’ under UTF-8 locales; models and tests should not care which.
    line = raw.strip().replace("\u2018", "'").replace("\u2019", "'")
    for pattern in (_EDG, _GCC):
        m = pattern.match(line)
        if m:
            diag, in_candidate = _located(m, source_file_map)
            # Warnings raised inside torch/CUDA headers are noise the model cannot act on.
            if diag.severity == "warning" and not in_candidate:
                return None
            return diag
    for pattern in _BARE:
        m = pattern.match(line)
        if m:
            msg = m.group("msg").strip()
            sym = _UNDEFINED_SYMBOL.search(msg)
            if sym:
                msg = (
                    f"undefined symbol: {_demangle(sym.group(1))} (declared but never defined: "
                    "does the declaration in cpp_sources match the definition in cuda_sources?)"
                )
            return CompileDiagnostic(message=msg)
    return None


def parse_nvcc_log(
    text: str, source_file_map: Mapping[str, SourceMap] | None = None
) -> list[CompileDiagnostic]:
    """Errors and candidate warnings from nvcc, gcc, ptxas, ld or a failed extension import.

    Build-system noise (ninja progress, `FAILED:`, command lines, notes, include stacks) is dropped;
    identical messages are merged with a count; locations in generated files listed in
    `source_file_map` (keyed by file name, e.g. `cuda.cu`) are mapped back to the candidate.
    """
    smaps = source_file_map or {}
    merged: dict[tuple[object, ...], CompileDiagnostic] = {}
    for raw in text.splitlines():
        diag = _parse_line(raw, smaps)
        if diag is None:
            continue
        key = (diag.file, diag.line, diag.column, diag.severity, diag.message)
        if key in merged:
            merged[key].count += 1
        else:
            merged[key] = diag
    return list(merged.values())


def _syntax_diagnostic(exc: SyntaxError, candidate_name: str | None) -> CompileDiagnostic:
    return CompileDiagnostic(
        file=candidate_name or exc.filename,
        line=exc.lineno,
        column=exc.offset,
        message=f"SyntaxError: {exc.msg}",
    )


def _triton_diagnostic(exc: Exception, candidate_source: str | None, candidate_name: str | None):
    """Triton's CompilationError says `at L:C:` relative to the kernel's `def` line."""
    src = getattr(exc, "src", None)
    node = getattr(exc, "node", None)
    msg = getattr(exc, "error_message", None) or str(exc).strip().splitlines()[-1]
    rel_line = getattr(node, "lineno", None)
    col = getattr(node, "col_offset", None)
    line = None
    if isinstance(src, str) and rel_line is not None and candidate_source:
        def_line = src.lstrip().splitlines()[0].rstrip() if src.strip() else ""
        for i, text in enumerate(candidate_source.splitlines(), start=1):
            if def_line and text.strip() == def_line.strip():
                line = i + rel_line - 1
                break
    return CompileDiagnostic(
        file=candidate_name if line is not None else None,
        line=line,
        column=col + 1 if line is not None and col is not None else None,
        message=f"{type(exc).__name__}: {msg}",
    )


def diagnostic_from_exception(
    exc: BaseException, candidate_path: str | Path | None = None
) -> CompileDiagnostic:
    """One diagnostic for a Python-level build failure (SyntaxError, Triton CompilationError…).

    Locations are reported in the candidate file when the exception carries enough to find them.
    """
    name = Path(candidate_path).name if candidate_path else None
    source = None
    if candidate_path and Path(candidate_path).is_file():
        source = Path(candidate_path).read_text(errors="replace")
    if isinstance(exc, SyntaxError):
        return _syntax_diagnostic(exc, name)
    if type(exc).__name__ == "CompilationError" and hasattr(exc, "src"):
        return _triton_diagnostic(exc, source, name)  # type: ignore[arg-type]
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if candidate_path and Path(tb.tb_frame.f_code.co_filename) == Path(candidate_path):
            line = tb.tb_lineno
        tb = tb.tb_next
    first = str(exc).strip().splitlines()
    return CompileDiagnostic(
        file=name if line is not None else None,
        line=line,
        message=f"{type(exc).__name__}: {first[0] if first else ''}",
    )


def make_compile_log(
    backend: Literal["cuda", "triton", "torch"],
    ok: bool,
    text: str,
    diagnostics: list[CompileDiagnostic],
    log_path: Path | None,
    **extra: object,
) -> CompileLog:
    """A CompileLog with the last LOG_TAIL_BYTES of `text`, writing the full text to `log_path`."""
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        log_path.write_text(text)
    raw = text.encode(errors="replace")
    tail = raw[-LOG_TAIL_BYTES:].decode(errors="replace")
    return CompileLog(
        backend=backend,
        ok=ok,
        diagnostics=diagnostics,
        log_tail=tail,
        log_path=str(log_path) if log_path is not None else None,
        **extra,  # type: ignore[arg-type]
    )
