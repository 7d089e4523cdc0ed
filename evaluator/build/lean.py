"""The lean build of a `load_inline` `.cu` (`EvalConfig.lean_cuda`, on by default; stdlib only:
it runs inside `evaluator.build.nvcc_parallel`).

`load_inline` puts `<torch/types.h>` in front of every `cuda_sources`, and parsing it is most of
a cold build: nvcc's host and device front ends each read all of ATen (a 6-line kernel: 19.1 s
with it, 3.1 s without on the CPU host, `bench/lean_prologue.py`). A `.cu` whose own text uses
nothing of torch does not need it. Such a file is built with, in place of that one line, the headers
outside torch that `<torch/types.h>` itself includes directly (found by the preprocessor's `-H`
under the build's own flags): the candidate's first line then sees the same standard and CUDA
declarations, and a `#line` keeps every diagnostic and `__FILE__` pointing into the original.

What qualifies (`refusal` says why not), so that no name in the candidate's text can mean
something else without torch:
- no identifier of torch's namespaces or prefixes (`torch`, `at`, `c10`, `TORCH_…`, …), outside
  comments and string literals;
- none of the macro names `<torch/types.h>` defines that the lean prologue does not (`CHECK`,
  `LOG`, … : found by `-dM` of both), so no macro in its text expands differently;
- every `#include <...>` reads the same after either prologue (`extra_refusal`, one more
  preprocessor run): each file it opens or skips there is one torch's header opened as well, or
  one neither opened (`<cfloat>`, `<vector>`: skipped after both; `<mma.h>`,
  `<cooperative_groups.h>`: read at the candidate's line after both), and none of those files
  names one of those macros, so no header it includes sees the macro state differ.
What is left: an overload torch adds to a standard name that would beat the standard ones for
the candidate's own call; a header torch includes only in nvcc's device pass (the headers are
found in the host pass); a text the comment-and-string scan misreads (raw strings, line
splices). Each can only change the candidate's own binary, never what judges it, and
`tests/evaluator/test_lean_build.py` compares the device code with the plain build's. A lean
build that fails for any reason is thrown away and the file is built the plain way
(`nvcc_parallel` reports `lean` or `lean refused: …` / `lean failed`).
"""

from __future__ import annotations

import os
import re
import subprocess
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

ENV = "KLOOP_NVCC_LEAN"
"""Set (to 1) in the build's environment when the evaluation asks for lean builds."""

PROLOGUE = ["#include <torch/types.h>", "#include <cuda.h>", "#include <cuda_runtime.h>"]
"""The lines `load_inline` puts in front of `cuda_sources` (torch/utils/cpp_extension.py)."""

TORCH_NAMES = {"torch", "at", "c10", "caffe2", "ATen", "pybind11", "ska", "ska_ordered",
               "TORCH_EXTENSION_NAME"}
TORCH_PREFIXES = ("TORCH_", "AT_", "C10_", "CAFFE_", "CAFFE2_", "THO_", "STD_TORCH_")

_COMMENT_OR_STRING = re.compile(
    r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'', re.S)
_INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]', re.M)
_DIRECTIVE = re.compile(r"^\s*#\s*(include\w*|import)\b[ \t]*(.*)$", re.M)
_IDENT = re.compile(r"[A-Za-z_]\w*")
_INCLUDE_ROOTS = [
    re.compile(r".*/include/c\+\+/[^/]+/(.+)"),                 # libstdc++
    re.compile(r".*/lib/gcc/[^/]+/[^/]+/include/(.+)"),         # gcc's own
    re.compile(r".*/include/cccl/(.+)"),                       # CUDA's thrust, cub, libcu++
    re.compile(r".*/targets/[^/]+/include/(.+)"),              # CUDA toolkit
    re.compile(r".*/cuda[^/]*/include/(.+)"),
    re.compile(r"/usr/include/(.+)"),
]


class Facts(NamedTuple):
    headers: list[str]
    """What `<torch/types.h>` includes directly from outside torch, in order, as `<name>`."""
    torch_macros: set[str]
    """Macros defined after `<torch/types.h>` and not after the lean prologue."""
    plain_paths: frozenset[str] = frozenset()
    """Every file `<torch/types.h>` opens (the `-H` tree, real paths)."""
    lean_paths: frozenset[str] = frozenset()
    """Every file the lean prologue opens."""


def include_name(path: str) -> str | None:
    """`/usr/include/c++/12/vector` -> `vector`, as an `#include <...>` would name it."""
    for root in _INCLUDE_ROOTS:
        if m := root.match(path):
            return m.group(1)
    return None


def torch_nvcc_flags(arch: str = "90") -> list[str]:
    """The flags torch's `load_inline` gives nvcc for a `.cu` (include paths, its defines, the
    target): what `kloop check` and the tests find the facts under (imports torch)."""
    from torch.utils import cpp_extension as ce

    return [*(f"-I{p}" for p in ce.include_paths()), *getattr(ce, "COMMON_NVCC_FLAGS", []),
            "-std=c++17", "-O3", f"-gencode=arch=compute_{arch},code=sm_{arch}",
            "--compiler-options", "-fPIC"]


def _preprocess_args(args: list[str], source: str) -> list[str]:
    """The compile's arguments for preprocessing another file: no source, output or
    dependency file (their values go with them)."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
            continue
        if a in ("-o", "--output-file", "--dependency-output", "-MF"):
            skip = True
            continue
        if a == source or a in ("-c", "--compile", "--generate-dependencies-with-compile",
                                "-MD", "-MMD"):
            continue
        out.append(a)
    return out


def facts(nvcc: str, args: list[str], source: str, work: Path,
          torch_lines: Sequence[str] = ()) -> Facts | None:
    """The lean prologue's headers and the macros torch's header adds, under this compile's own
    flags (host pass; two preprocessor runs, ~1 s each); None if the preprocessor refuses.
    `torch_lines`: more of torch's includes that the lean prologue stands in for (the device
    half of a torch-form file, `evaluator.build.torch_form`); a header they include that this
    module cannot name (Python's, through pybind11) is left out, and the macros it defines
    stay among those a candidate may not name."""
    flags = _preprocess_args(args, source)
    full, lean = work / "full.cu", work / "lean.cu"
    full.write_text("\n".join([*PROLOGUE, *torch_lines]) + "\n")
    r = subprocess.run([nvcc, *flags, "-E", "-Xcompiler", "-dM", "-Xcompiler", "-H", str(full)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        return None
    torch_dirs = _torch_dirs(r.stderr)
    stack: list[str] = []
    headers: list[str] = []
    for depth, path in _tree(r.stderr):
        del stack[depth - 1:]
        parent = stack[-1] if stack else None
        stack.append(path)
        if parent is None or path.startswith(torch_dirs) or not parent.startswith(torch_dirs):
            continue  # the prologue's own lines, torch's headers, or a header's own includes
        name = include_name(path)
        if name is None and torch_lines:
            continue
        if name is None:  # a header this module cannot name: no lean build
            return None
        if name not in headers:
            headers.append(name)
    lean.write_text(prologue_text(headers))
    got = _macros(nvcc, flags, lean)
    if got is None or not headers:
        return None
    leaned, lean_tree = got
    return Facts(headers, set(_defines(r.stdout)) - set(leaned), _paths(r.stderr),
                 _paths(lean_tree))


def _tree(text: str) -> list[tuple[int, str]]:
    """(depth, path) of each line of a `-H` include tree (`.. /usr/include/stdio.h`)."""
    return [(len(m.group(1)), m.group(2)) for line in text.splitlines()
            if (m := re.match(r"(\.+) (\S+)$", line))]


def _paths(tree: str) -> frozenset[str]:
    return frozenset(os.path.realpath(path) for _, path in _tree(tree))


def extra_refusal(nvcc: str, args: list[str], source: str, found: Facts, names: list[str],
                  work: Path) -> str | None:
    """Why the headers `names` (the candidate's `#include <...>`s) cannot be included after the
    lean prologue as after torch's; None if they can. The preprocessor's `-H` tree of the lean
    prologue followed by them (one more run, 0.2-0.5 s) lists every file they open, and every
    file they skip as read already: each must be one torch's header opened too, or one neither
    prologue opened (skipped after both, or read after both at the candidate's line), and its
    text, outside comments and strings, must name none of the macros only torch's header
    defines (so it reads the same after either)."""
    (work / "extra.h").write_text("".join(f"#include <{n}>\n" for n in names))
    probe = work / "extra.cu"
    probe.write_text(prologue_text(found.headers) + '#include "extra.h"\n')
    got = _macros(nvcc, _preprocess_args(args, source), probe)
    if got is None:
        return f"<{names[0]}> does not preprocess after the lean prologue"
    files, inside = [], False
    for depth, path in _tree(got[1]):
        if depth == 1:
            inside = os.path.basename(path) == "extra.h"
        elif inside:
            files.append(os.path.realpath(path))
    for path in dict.fromkeys(files):
        label = f"<{include_name(path) or path}>"
        if (path in found.plain_paths) != (path in found.lean_paths):
            which = "torch's header" if path in found.plain_paths else "the lean prologue"
            return f"{label} was read already by {which} only"
        try:
            text = Path(path).read_text(errors="replace")
        except OSError:
            return f"{path} cannot be read"
        hit = set(_IDENT.findall(_COMMENT_OR_STRING.sub(" ", text))) & found.torch_macros
        if hit:
            return f"{label} names `{min(hit)}`, a macro torch's header defines"
    return None


def _torch_dirs(tree: str) -> tuple[str, ...]:
    """Where torch's headers live: the `.../torch/include/` above the `<torch/types.h>` found
    (its ATen, c10 and torch/csrc/api/include trees are all below it)."""
    for line in tree.splitlines():
        m = re.match(r"\. (\S+?/torch/include/)\S*torch/types\.h$", line)
        if m:
            return (m.group(1),)
    return ("\0",)


def _macros(nvcc: str, flags: list[str], src: Path) -> tuple[dict[str, str], str] | None:
    """The macros defined after `src`, and its `-H` include tree."""
    r = subprocess.run([nvcc, *flags, "-E", "-Xcompiler", "-dM", "-Xcompiler", "-H", str(src)],
                       capture_output=True, text=True)
    return (_defines(r.stdout), r.stderr) if r.returncode == 0 else None


def _defines(dump: str) -> dict[str, str]:
    out = {}
    for line in dump.splitlines():
        if m := re.match(r"#define ([A-Za-z_]\w*)(.*)$", line):
            out[m.group(1)] = m.group(2)
    return out


def prologue_text(headers: list[str]) -> str:
    return "".join(f"#include <{h}>\n" for h in headers) + "".join(
        line + "\n" for line in PROLOGUE[1:])


def refusal(text: str, found: Facts,
            extra: Callable[[list[str]], str | None] | None = None) -> str | None:
    """Why the candidate's text (what follows `load_inline`'s prologue) cannot be built lean;
    None if it can. `extra`: asked about the `<...>` headers it includes (`extra_refusal` under
    the build's flags); without it only those the lean prologue includes itself are let by."""
    bare = _COMMENT_OR_STRING.sub(lambda m: m.group(0) if m.group(0).startswith('"') else " ",
                                  text)
    for kind, rest in _DIRECTIVE.findall(bare):  # a macro-named or `_next` include: unchecked
        if kind != "include" or not rest.startswith(("<", '"')):
            return f"it has `#{kind} {rest.strip()[:40]}`, which the lean build does not follow"
    includes = _INCLUDE.findall(bare)
    made = set(found.headers) | {"cuda.h", "cuda_runtime.h"}
    others: list[str] = []
    for kind, name in includes:
        if kind == '"' or name.startswith(("torch/", "ATen/", "c10/", "caffe2/", "pybind11/")) \
                or (extra is None and name not in made):
            return f"it includes {kind}{name}{'>' if kind == '<' else kind}, which the lean " \
                   "prologue does not"
        if name not in others:
            others.append(name)
    code = _COMMENT_OR_STRING.sub(" ", text)
    for ident in sorted(set(_IDENT.findall(code))):
        if ident in TORCH_NAMES or ident.startswith(TORCH_PREFIXES):
            return f"it names `{ident}`, which is torch's"
        if ident in found.torch_macros:
            return f"it names `{ident}`, a macro torch's header defines"
    if others and extra is not None:
        return extra(others)
    return None


def lean_source(source: Path, found: Facts,
                extra: Callable[[list[str]], str | None] | None = None) -> tuple[str | None, str]:
    """(the lean file's text, why not) for `source` as `load_inline` wrote it."""
    text = source.read_text()
    lines = text.split("\n")
    if lines[:3] != PROLOGUE:
        return None, "not load_inline's prologue"
    rest = "\n".join(lines[3:])
    why = refusal(rest, found, extra)
    if why is not None:
        return None, why
    # `#line 4`: the candidate's first line is line 4 of the original file, as it was.
    return prologue_text(found.headers) + f'#line 4 "{source}"\n' + rest, ""
