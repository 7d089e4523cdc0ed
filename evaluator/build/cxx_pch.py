"""The host compiler of kloop's `load_inline` builds, with torch's header precompiled (stdlib only;
torch's build runs it as its C++ compiler through `CXX`, see `evaluator.build.buildcache`).

`load_inline` writes a binding file, `main.cpp`, whose first line is `#include <torch/extension.h>`
(about 20 s of g++ on the H200, most of it that header). For that one compile, if the trusted
builder (`evaluator.build.pch`) has made a precompiled header under exactly these compiler flags
(all of them but the extension's name, which no torch header reads), this adds `-I <its dir>`:
the directory holds `torch/extension.h.gch` and a `torch/extension.h` that only forwards to the
real header (`#pragma once` + `#include_next`). g++ takes the `.gch` in place of the first
include when it is valid for this compile (its own check) and otherwise reads the forwarding
header, so a stale or foreign PCH costs time, never meaning: the source, the compiler and the
flags are torch's own. Every other call (the link, `-v`, `-dumpversion`, any other source) runs
the real compiler untouched.

Environment: `KLOOP_CXX_REAL` the compiler torch would have run (`CXX`, else `c++`);
`KLOOP_PCH_ROOT` the PCH store (read-only to candidates); `KLOOP_CXX_REPORT` a file that gets one
line per binding compile (`pch`: g++ took the PCH, by its dependency output; or `plain: <why>`); `KLOOP_CXX_CAPTURE` (the trusted builder's
probe only): write this compile's key and flags there and fail, compiling nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

REAL_ENV = "KLOOP_CXX_REAL"
ROOT_ENV = "KLOOP_PCH_ROOT"
REPORT_ENV = "KLOOP_CXX_REPORT"
CAPTURE_ENV = "KLOOP_CXX_CAPTURE"
HEADER = "torch/extension.h"
READY = "ready"
FORWARD = "#pragma once\n#include_next <torch/extension.h>\n"
"""The header in the PCH's directory: where g++ does not take the `.gch` (an invalid PCH, or the
include is not the first thing in the file), it reads this and lands on the real header, found
in the directories after this one, exactly as without it."""
_NAME_MACRO = "-DTORCH_EXTENSION_NAME="
_KEY_VERSION = 1


def binding_flags(args: list[str]) -> list[str] | None:
    """The flags of a compile of `load_inline`'s `main.cpp`, without what names its files
    (`-MMD -MF d -c main.cpp -o main.o`) and without the extension's name; None for any other
    call."""
    if "-c" not in args or "-o" not in args:
        return None
    out: list[str] = []
    inputs: list[str] = []
    skip = False
    for i, a in enumerate(args):
        if skip:
            skip = False
            continue
        if a in ("-MF", "-o"):
            skip = True
            if i + 1 >= len(args):
                return None
            continue
        if a in ("-MMD", "-c") or a.startswith(_NAME_MACRO):
            continue
        if not a.startswith("-") and (a.endswith(".cpp") or a.endswith(".cc")):
            inputs.append(a)
            continue
        out.append(a)
    if len(inputs) != 1 or os.path.basename(inputs[0]) != "main.cpp":
        return None
    return out


def pch_key(compiler: str, flags: list[str]) -> str:
    payload = {"v": _KEY_VERSION, "cxx": compiler, "flags": flags}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def _report(line: str) -> None:
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    try:
        with open(path, "a") as f:
            f.write(line.replace("\n", " ") + "\n")
    except OSError:  # a report is never worth a failed build
        pass


def main(args: list[str]) -> int:
    real = os.environ.get(REAL_ENV) or "c++"
    flags = binding_flags(args)
    capture = os.environ.get(CAPTURE_ENV)
    if flags is not None and capture:
        Path(capture).write_text(json.dumps({"cxx": real, "flags": flags,
                                             "key": pch_key(real, flags)}))
        return 1
    command = shlex.split(real) or ["c++"]  # `CXX="ccache g++"` is one shell word list
    root = os.environ.get(ROOT_ENV)
    entry = Path(root) / pch_key(real, flags) if root and flags is not None else None
    if entry is None or not (entry / READY).is_file():
        if flags is not None:
            _report("plain: no precompiled header for these flags")
        os.execvp(command[0], [*command, *args])
    code = subprocess.run([*command, *args, "-I", str(entry)]).returncode
    if code == 0:
        _report(_taken(args))
    return code


def _taken(args: list[str]) -> str:
    """Whether g++ took the PCH: its dependency file then names no header the PCH holds (torch's
    own `-MMD -MF` output, which lists every header it read)."""
    source = next(a for a in args if os.path.basename(a) == "main.cpp")
    try:
        if HEADER not in Path(source).read_text(errors="replace"):
            return "plain: the file does not include the header"
    except OSError:
        pass
    try:
        text = Path(args[args.index("-MF") + 1]).read_text()
    except (ValueError, IndexError, OSError):
        return "pch: offered (no dependency file to tell whether g++ took it)"
    return "plain: g++ did not take the precompiled header" if HEADER in text else "pch"


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
