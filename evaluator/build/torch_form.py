"""The torch form of a `load_inline` `.cu`, split into its device half and its host half
(stdlib only: it runs inside `evaluator.build.nvcc_parallel`).

Most `.cu` files models write include `<torch/extension.h>` and hold, beside their kernels, host
functions written against torch (`torch::Tensor relu(torch::Tensor x) { ... k<<<g, b>>>(...); }`).
nvcc reads all of torch three times for such a file (host front end, device front end, host
compile): 41-48 s cold on the H200 host where a torch-free file takes 8 s. Only the host
functions need torch, and only the kernels need nvcc. So:

- the **device half** is the file with every host function and every torch include blanked out
  (spaces, newlines kept, so each line stays where it was), plus one launcher per launched kernel
  written on the kernel's closing line: `void kloop_launch_k(dim3 g, dim3 b, size_t s,
  cudaStream_t t, <k's own parameters>) { k<<<g, b, s, t>>>(<their names>); }`. It must then
  qualify for the lean build (`evaluator.build.lean`: no name of torch's, the headers torch's
  own headers include in place of them), and nvcc builds it in seconds;
- the **host half** is the file with every kernel and device function blanked out, the launcher's
  prototype where the kernel was, and each launch `k<<<c1, c2, c3, c4>>>(args)` rewritten as
  `kloop_launch_k(c1, c2, c3, c4, args)` (a missing shared-memory size or stream is 0, as in a
  launch). g++ compiles it under torch's flags for the binding file, where the precompiled
  `<torch/extension.h>` serves (`evaluator.build.pch`);
- `ld -r` joins the two objects into the one nvcc would have written.

What stays the same: each kernel and device function is compiled by nvcc from its own text; each
host function by the host compiler nvcc would have used, from its own text; a launch converts its
configuration to `dim3, dim3, size_t, cudaStream_t` and its arguments to the kernel's parameter
types, which is what the launcher's parameters do. What differs: the host half is compiled
without `__CUDACC__` (torch's headers then leave out their device overloads, which host code does
not call), and it sees `<torch/extension.h>` before the lines `load_inline` put in front of it.
Anything this module cannot place for certain is refused (`split` says why) and the file is built
the plain way, as is any file whose halves fail to build: a build never fails here that would
have succeeded plainly, and a plain build's diagnostics are the ones a candidate sees.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NamedTuple

ENV = "KLOOP_NVCC_TORCH_FORM"
"""Set (to 1) in the build's environment when the evaluation asks for torch-form splits."""

LAUNCHER = "kloop_launch_"
TORCH_INCLUDE = re.compile(r"^\s*#\s*include\s*<(torch|ATen|c10|caffe2|pybind11)/[^>]*>")
_TORCH_WORDS = {"torch", "at", "c10", "caffe2", "ATen", "pybind11", "py", "TORCH_EXTENSION_NAME"}
_TORCH_PREFIXES = ("TORCH_", "AT_", "C10_", "CAFFE_", "CAFFE2_", "PYBIND11_")
_DEVICE_DECL = {"__device__", "__constant__", "__shared__", "__managed__"}
_DEVICE_ONLY_WORDS = {"__global__", "__device__", "__shared__", "__constant__", "__managed__",
                      "threadIdx", "blockIdx", "blockDim", "gridDim", "warpSize",
                      "__syncthreads", "__grid_constant__"}
_INLINE = {"inline", "static", "constexpr", "__forceinline__", "__inline__"}
_IDENT = re.compile(r"[A-Za-z_]\w*")


class Refused(Exception):
    """The file cannot be split for certain: it is built the plain way."""


class Split(NamedTuple):
    device: str
    """The device half: the candidate's text with the host's parts blanked, launchers added."""
    host: str
    """The host half: the kernels blanked, launches rewritten, launchers declared."""
    torch_includes: list[str]
    """The candidate's own `#include <torch/...>`-style lines (the device half's lean prologue
    stands in for them and for `load_inline`'s `<torch/types.h>`)."""
    launched: list[str]
    """The kernels the host half launches."""


@dataclass
class _Item:
    kind: str  # directive, namespace_open, namespace_close, kernel, device, hostdevice, host,
    #            decl_device, decl_host, decl_both
    start: int
    end: int
    name: str | None = None
    params: str | None = None
    namespace: tuple[str, ...] = ()
    template: bool = False
    children: list[_Item] = field(default_factory=list)


def mask(text: str) -> tuple[str, dict[int, int]]:
    """`text` with comments, string and character literals blanked (quotes kept) and every
    preprocessor line blanked, each character where it was, and the directives' spans (start
    to end); raises Refused for what this scanner does not read (raw strings, line splices
    outside directives, digit separators)."""
    out = list(text)
    directives: dict[int, int] = {}
    i, n = 0, len(text)
    line_start = True
    while i < n:
        c = text[i]
        if c == "\n":
            line_start = True
            i += 1
            continue
        if line_start and c in " \t":
            i += 1
            continue
        if line_start and c == "#":
            j = i
            while j < n and text[j] != "\n":
                if text[j] == "\\" and j + 1 < n and text[j + 1] == "\n":
                    j += 2
                    continue
                j += 1
            _blank(out, i, j)
            directives[i] = j
            i = j
            continue
        line_start = False
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            _blank(out, i, j)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            if j < 0:
                raise Refused("an unterminated comment")
            _blank(out, i, j + 2)
            i = j + 2
        elif c in "\"'":
            if c == "'" and i > 0 and text[i - 1].isalnum():
                raise Refused("a digit separator")
            if c == '"' and i > 0 and text[i - 1] == "R" and (i < 2 or not text[i - 2].isalnum()):
                raise Refused("a raw string literal")
            j = i + 1
            while j < n and text[j] != c:
                if text[j] == "\n":
                    raise Refused("an unterminated literal")
                j += 2 if text[j] == "\\" else 1
            if j >= n:
                raise Refused("an unterminated literal")
            _blank(out, i + 1, j, "x")
            i = j + 1
        elif c == "\\" and i + 1 < n and text[i + 1] == "\n":
            raise Refused("a line splice outside a directive")
        else:
            i += 1
    return "".join(out), directives


def _blank(out: list[str], a: int, b: int, fill: str = " ") -> None:
    for k in range(a, b):
        if out[k] != "\n":
            out[k] = fill


def _match(m: str, i: int) -> int:
    """The index after the bracket that closes the one at `i` (in masked text)."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    stack = [pairs[m[i]]]
    j = i + 1
    while j < len(m):
        c = m[j]
        if c in pairs:
            stack.append(pairs[c])
        elif c in ")]}":
            if c != stack.pop():
                raise Refused("unbalanced brackets")
            if not stack:
                return j + 1
        j += 1
    raise Refused("unbalanced brackets")


def _words(s: str) -> set[str]:
    return set(_IDENT.findall(s))


def _names_torch(words: set[str]) -> bool:
    return bool(words & _TORCH_WORDS) or any(w.startswith(_TORCH_PREFIXES) for w in words)


def scan(text: str, m: str, directives: dict[int, int], start: int, end: int,
         namespace: tuple[str, ...] = ()) -> list[_Item]:
    """The declarations between `start` and `end` of one namespace scope, classified."""
    items: list[_Item] = []
    i = start
    while i < end:
        if i in directives:
            items.append(_Item("directive", i, directives[i], namespace=namespace))
            i = directives[i]
        elif m[i].isspace() or m[i] == ";":  # blank, or an empty declaration
            i += 1
        elif m[i] == "}":
            raise Refused("a closing brace outside any block")
        else:
            items.append(_declaration(text, m, directives, i, end, namespace))
            i = items[-1].end
    return items


def _declaration(text: str, m: str, directives: dict[int, int], i: int, end: int,
                 namespace: tuple[str, ...]) -> _Item:
    j = i
    head_parens = False
    while j < end:
        c = m[j]
        if j in directives:  # inside a declaration's head (not a body): cannot be placed
            raise Refused("a directive inside a declaration")
        if c in "([":
            head_parens = head_parens or c == "("
            j = _match(m, j)
            continue
        if c == ";":
            return _plain_declaration(text, m, i, j + 1, namespace)
        if c == "{":
            head = m[i:j]
            words = head.split()
            if words[:1] == ["namespace"] or head.lstrip().startswith("inline namespace"):
                names = _IDENT.findall(head)
                name = names[-1] if names[-1] != "namespace" else ""
                if not name:
                    raise Refused("an anonymous namespace")
                close = _match(m, j)
                inner = scan(text, m, directives, j + 1, close - 1, (*namespace, name))
                return _Item("namespace_open", i, close, name=name, namespace=namespace,
                             children=inner)
            if re.match(r'\s*extern\s*"', head):
                raise Refused('an `extern "…"` block')
            close = _match(m, j)
            hw = _words(head)
            if hw & {"struct", "class", "union", "enum", "typedef"} or "=" in _top(head) \
                    or not head_parens:
                k = close
                while k < end and m[k] != ";":
                    if m[k] in "({[":
                        k = _match(m, k)
                        continue
                    k += 1
                return _plain_declaration(text, m, i, k + 1, namespace)
            return _function(text, m, i, j, close, namespace)
        j += 1
    raise Refused("a declaration that does not end")


def _top(s: str) -> str:
    """`s` with everything inside brackets removed."""
    out, depth = [], 0
    for c in s:
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0:
            out.append(c)
    return "".join(out)


def _plain_declaration(text: str, m: str, i: int, j: int, namespace) -> _Item:
    body = m[i:j]
    words = _words(body)
    if words & _DEVICE_DECL or "__global__" in words:
        return _Item("decl_device", i, j, namespace=namespace)
    if _names_torch(words):
        return _Item("decl_host", i, j, namespace=namespace)
    first = body.split()[0] if body.split() else ""
    if "(" in _top_parens(body) and not words & {"struct", "class", "union", "enum", "typedef",
                                                    "using", "static_assert"}:
        # A function's prototype names no torch type: a host prototype (both halves may see
        # it: it declares, never defines).
        return _Item("decl_both", i, j, namespace=namespace)
    if first in ("struct", "class", "union", "enum", "typedef", "using", "static_assert",
                 "template") or words & {"static", "const", "constexpr"}:
        return _Item("decl_both", i, j, namespace=namespace)
    raise Refused("a variable with external linkage (it would be defined in both halves)")


def _top_parens(s: str) -> str:
    return s.split("{", 1)[0]


def _function(text: str, m: str, i: int, body: int, close: int, namespace) -> _Item:
    head = m[i:body]
    words = _words(head)
    template = head.lstrip().startswith("template")
    if "__global__" in words:
        kind = "kernel"
    elif "__device__" in words and "__host__" not in words:
        kind = "device"
    elif "__device__" in words:
        if not words & _INLINE and not template:
            raise Refused("a `__host__ __device__` function that is not inline")
        kind = "hostdevice"
    else:
        kind = "host"
    name, params = _signature(m, i, body)
    return _Item(kind, i, close, name=name, params=params, namespace=namespace,
                 template=template)


def _signature(m: str, i: int, body: int) -> tuple[str | None, str | None]:
    """(name, parameter text) of the function whose head is m[i:body]: the identifier before the
    last top-level `(` of the head that is followed by the body or qualifiers only."""
    head = m[i:body]
    j, last = 0, None
    while j < len(head):
        if head[j] == "(":
            k = _match(head, j)
            last = (j, k)
            j = k
            continue
        if head[j] == "[":
            j = _match(head, j)
            continue
        j += 1
    if last is None:
        return None, None
    before = head[: last[0]].rstrip()
    name = re.search(r"([A-Za-z_][\w:]*)$", before)
    # A constructor's initializer list (`) : a(x) {`) or a trailing return puts another `(`
    # last: take the first `(` that follows a name instead when the head has `)` `:`.
    if name is None or name.group(1) in ("decltype", "noexcept", "__launch_bounds__"):
        first = re.search(r"([A-Za-z_][\w:]*)\s*\(", head)
        if first is None:
            return None, None
        k = _match(head, first.end() - 1)
        return first.group(1), head[first.end(): k - 1]
    return name.group(1), head[last[0] + 1: last[1] - 1]


def _flatten(items: list[_Item]) -> list[_Item]:
    out = []
    for it in items:
        out.append(it)
        out.extend(_flatten(it.children))
    return out


def _param_names(params: str) -> list[str]:
    """Each parameter's name (the identifier its declarator ends with); Refused for unnamed,
    defaulted, variadic or grid-constant parameters."""
    text = params.strip()
    if text in ("", "void"):
        return []
    parts, depth, cur = [], 0, []
    for c in text:
        if c in "(<[{":
            depth += 1
        elif c in ")>]}":
            depth -= 1
        if c == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(c)
    parts.append("".join(cur))
    names = []
    for p in parts:
        p = re.sub(r"\[[^\]]*\]\s*$", "", p.strip())
        if "=" in p or "..." in p or "__grid_constant__" in p:
            raise Refused("a kernel parameter with a default, a pack or `__grid_constant__`")
        got = re.search(r"([A-Za-z_]\w*)$", p)
        words = _IDENT.findall(p)
        if got is None or len(words) < 2 or got.group(1) in ("const", "volatile",
                                                               "__restrict__", "int", "float"):
            raise Refused("a kernel parameter without a name")
        names.append(got.group(1))
    return names


_LAUNCH = re.compile(r"([A-Za-z_][\w:]*)\s*(<[^<>;]*>)?\s*<<<")


def split(text: str) -> Split:
    """The two halves of the candidate's `.cu` text (what follows `load_inline`'s prologue);
    raises Refused with the reason when it cannot be split for certain."""
    m, directives = mask(text)
    items = scan(text, m, directives, 0, len(text))
    flat = _flatten(items)
    includes = []
    for it in flat:
        if it.kind == "directive":
            line = text[it.start:it.end]
            if re.match(r"\s*#\s*(if|ifdef|ifndef|elif|else|endif)\b", line):
                raise Refused("conditional compilation at namespace scope")
            if TORCH_INCLUDE.match(line):
                includes.append(line.strip())
    if not any("torch/extension.h" in line for line in includes):
        raise Refused("it does not include <torch/extension.h>")
    kernels = {it.name: it for it in flat if it.kind == "kernel"}
    device_names = {it.name for it in flat if it.kind in ("device", "kernel")} | {
        n for it in flat if it.kind == "decl_device" for n in _declared(m[it.start:it.end])}
    if len([it for it in flat if it.kind == "kernel"]) != len(kernels):
        raise Refused("two kernels of one name")

    dev, host = list(text), list(text)
    hm = list(m)  # the host half's mask, to check what is left in it
    launched: dict[str, _Item] = {}
    for it in flat:
        if it.kind == "directive":
            line = text[it.start:it.end]
            if TORCH_INCLUDE.match(line) or _names_torch(_words(line)):
                _blank(dev, it.start, it.end)
        elif it.kind in ("host", "decl_host"):
            _blank(dev, it.start, it.end)
        elif it.kind in ("kernel", "device", "decl_device"):
            _blank(host, it.start, it.end)
            _blank(hm, it.start, it.end)
        elif it.kind == "hostdevice":
            _blank(hm, it.start, it.end)  # kept in both; its device words are its own

    edits: list[tuple[int, int, str]] = []
    for it in flat:
        if it.kind != "host" and it.kind != "decl_host":
            continue
        for launch in _LAUNCH.finditer(m, it.start, it.end):
            name = launch.group(1).split("::")[-1]
            k = kernels.get(name)
            if k is None:
                raise Refused(f"a launch of `{launch.group(1)}`, not a kernel of this file")
            if launch.group(2) or k.template:
                raise Refused(f"a launch of the template kernel `{name}`")
            if "::" in launch.group(1) and launch.group(1).split("::")[:-1] != list(k.namespace):
                raise Refused(f"a launch of `{launch.group(1)}` from another namespace")
            edits.append(_rewrite(text, m, launch, k))
            launched[name] = k
            for a in range(launch.start(), edits[-1][1]):
                if hm[a] != "\n":
                    hm[a] = " "
    for a, b, new in sorted(edits, reverse=True):
        host[a:b] = list(new)
        hm[a:b] = [" " if c != "\n" else c for c in new]

    left = _words("".join(hm))
    if bad := left & _DEVICE_ONLY_WORDS:
        raise Refused(f"the host's part names `{min(bad)}`")
    if "<<<" in "".join(hm):
        raise Refused("a launch this module cannot read")
    if named := left & device_names:
        raise Refused(f"the host's part names `{min(named)}` outside a launch")

    # Launchers: the definition on the kernel's closing line (device half), the prototype
    # where the kernel was (host half); both inside the kernel's namespaces.
    for name, k in sorted(launched.items(), key=lambda kv: -kv[1].start):
        names = _param_names(k.params or "")
        proto = _prototype(name, k.params or "")
        call = ", ".join(["kloop_g", "kloop_b", "kloop_s", "kloop_t", *names][4:])
        body = f" {proto} {{ {name}<<<kloop_g, kloop_b, kloop_s, kloop_t>>>({call}); }}"
        dev[k.end:k.end] = list(body)
        host[k.start:k.start] = list(proto + ";")
    return Split("".join(dev), "".join(host), includes, sorted(launched))


def _declared(decl: str) -> set[str]:
    """The names a device variable's declaration introduces (`__constant__ float w[4];`)."""
    head = re.split(r"[=\[;({]", decl, maxsplit=1)[0]
    words = _IDENT.findall(head)
    return {words[-1]} if words else set()


def _prototype(name: str, params: str) -> str:
    flat = " ".join(params.split())
    extra = f", {flat}" if flat.strip() not in ("", "void") else ""
    return (f"void {LAUNCHER}{name}(dim3 kloop_g, dim3 kloop_b, size_t kloop_s, "
            f"cudaStream_t kloop_t{extra})")


def _rewrite(text: str, m: str, launch: re.Match, k: _Item) -> tuple[int, int, str]:
    """(start, end, replacement) turning `k<<<config>>>(args)` into a launcher call; newlines
    inside the launch stay, so every line after it keeps its number."""
    cfg_start = launch.end()
    cfg_end = m.find(">>>", cfg_start)
    if cfg_end < 0:
        raise Refused("a launch without `>>>`")
    config = _split_commas(text, m, cfg_start, cfg_end)
    if not 2 <= len(config) <= 4:
        raise Refused("a launch with other than 2-4 configuration values")
    j = cfg_end + 3
    while j < len(m) and m[j].isspace():
        j += 1
    if j >= len(m) or m[j] != "(":
        raise Refused("a launch without arguments in parentheses")
    close = _match(m, j)
    args = text[j + 1: close - 1]
    values = config + ["0"] * (4 - len(config))
    inside = ", ".join(values) + ("," + args if args.strip() else "")
    qualifier = launch.group(1)[: -len(k.name)]
    new = f"{qualifier}{LAUNCHER}{k.name}({inside})"
    lost = text.count("\n", launch.start(), close) - new.count("\n")
    return launch.start(), close, new + "\n" * lost


def _split_commas(text: str, m: str, a: int, b: int) -> list[str]:
    parts, depth, start = [], 0, a
    for j in range(a, b):
        c = m[j]
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif c == "," and depth == 0:
            parts.append(text[start:j])
            start = j + 1
    parts.append(text[start:b])
    return parts
