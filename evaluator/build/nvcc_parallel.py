"""nvcc with its host and device chains run side by side (stdlib only; torch's build calls it as
its nvcc through `PYTORCH_NVCC`, see `evaluator.build.buildcache`).

For one target architecture nvcc runs, one after the other: the host chain (gcc -E, cudafe++),
the device chain (gcc -E, cicc, ptxas, fatbinary) and the host compile that embeds the fatbinary.
Both chains parse every header the source includes, so a `.cu` that includes
`<torch/extension.h>` spends two front-end passes of ~20-30 s each before the host compile. The
chains share one input only: the module id file cudafe++ writes and cicc reads (the name of the
file's anonymous namespace and registration symbols, random on every nvcc run). Here the id is
written first, in nvcc's format, and the two chains run at once; then the rest of nvcc's own
commands, as `nvcc --dryrun` printed them, with the same flags. The compilers, flags and inputs
are nvcc's, so what the source means does not change (tests/evaluator/test_nvcc_parallel.py
compares the intermediate files with a plain run's).

Output and exit status are what plain nvcc gives: the host chain's output first, then the device
chain's, and on a failure only what nvcc would have printed up to it. Anything whose commands do
not have this shape (several architectures, `-E`, `--cubin`, no compile) runs as plain nvcc.
"""

from __future__ import annotations

import os
import re
import secrets
import shlex
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

if __package__ in (None, ""):  # run as a script (torch's build calls it as its nvcc)
    # The directory holding the kloop package: the clone, or site-packages for a wheel.
    sys.path.insert(0, str(next(p for p in Path(__file__).resolve().parents
                                if (p / "kloop" / "__init__.py").is_file())))
from kloop.evaluator.build import cxx_pch, lean  # noqa: E402
from kloop.evaluator.build import torch_form as torch_split  # noqa: E402

SHELL = "/bin/sh"  # what ninja runs commands with; the scripts here are POSIX
REPORT_ENV = "KLOOP_NVCC_REPORT"
_ASSIGN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
_GEN_ID = "--gen_module_id_file"
_ID_FILE = "--module_id_file_name"


class Plan(NamedTuple):
    variables: list[str]
    commands: list[str]
    said: str
    """What nvcc itself printed besides its commands (its own warnings), to pass on."""


def dryrun(nvcc: str, args: list[str], env: dict[str, str] | None = None) -> Plan | None:
    """nvcc's variables and commands for `args`; None if it would not run them, or if it sets a
    variable between two commands (the chains here share one prologue)."""
    r = subprocess.run([nvcc, "--dryrun", *args], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        return None
    out = r.stderr.splitlines()
    lines = [ln[3:] for ln in out if ln.startswith("#$ ")]
    variables = [ln for ln in lines if _ASSIGN.match(ln)]
    if lines[:len(variables)] != variables:  # set between commands: not one prologue's worth
        return None
    said = "".join(ln + "\n" for ln in out if not ln.startswith("#$ "))
    return Plan(variables, lines[len(variables):], r.stdout + said)


def _tool(command: str) -> str:
    first = shlex.split(command)[0] if command.strip() else ""
    return Path(first.strip('"')).name


def split(commands: list[str]) -> tuple[list[str], list[str], list[str], str] | None:
    """(host chain, device chain, the rest, module id file) when the commands have the one-
    architecture shape: [gcc -E, cudafe++ (writes the id), gcc -E, cicc (reads it), ptxas,
    fatbinary, (rm)] then the host compile; else None."""
    tools = [_tool(c) for c in commands]
    if tools.count("cudafe++") != 1 or tools.count("cicc") != 1 or tools.count("ptxas") != 1:
        return None
    fe, ci = tools.index("cudafe++"), tools.index("cicc")
    if fe != 1 or ci != 3 or tools[4:6] != ["ptxas", "fatbinary"]:
        return None
    end = 7 if tools[6:7] == ["rm"] else 6
    cudafe, cicc = shlex.split(commands[fe]), shlex.split(commands[ci])
    if _GEN_ID not in cudafe or _ID_FILE not in cudafe or _ID_FILE not in cicc:
        return None
    id_file = cudafe[cudafe.index(_ID_FILE) + 1]
    if cicc[cicc.index(_ID_FILE) + 1] != id_file or _GEN_ID in cicc or not commands[end:]:
        return None
    host = [commands[0], commands[fe].replace(f" {_GEN_ID} ", " ", 1)]
    if _GEN_ID in host[1]:
        return None
    return host, commands[2:end], commands[end:], id_file


def module_id(source: str) -> str:
    """An id in nvcc's own format: `_<8 hex>_<length of the name>_<name>_<8 hex>`."""
    name = re.sub(r"[^A-Za-z0-9]", "_", Path(source).name)
    return f"_{secrets.token_hex(4)}_{len(name)}_{name}_{secrets.token_hex(4)}"


def _exports(env: list[str]) -> list[str]:
    """nvcc's variables that commands may use (`"$CICC_PATH/cicc"`); lines that are not one
    shell word (`SYSTEM_INCLUDES="-isystem" "..."`) are nvcc's notes, already in the commands."""
    out = []
    for line in env:
        try:
            words = shlex.split(line)
        except ValueError:
            continue
        if len(words) == 1 and "=" in words[0]:
            name, value = words[0].split("=", 1)
            out.append(f"export {name}={shlex.quote(value)}")
    return out


def _chain_script(prologue: str, chain: list[str]) -> str:
    # nvcc's own `rm` of an intermediate ignores a missing file.
    lines = [f"rm -f {c[3:]}" if c.startswith("rm ") else f"{c} || exit $?" for c in chain]
    return prologue + "\n" + "\n".join(lines) + "\n"


def _run_chain(prologue: str, chain: list[str], out: Path,
               env: dict[str, str]) -> subprocess.Popen:
    with out.open("wb") as f:
        return subprocess.Popen([SHELL, "-c", _chain_script(prologue, chain)], stdout=f,
                                stderr=subprocess.STDOUT, env=env)


def run(args: list[str]) -> int:
    nvcc = "nvcc"  # on PATH, unless given: kloop's build passes torch's own
    if args[:1] == ["--nvcc"]:
        nvcc, args = args[1], args[2:]
    source = next((a for a in args if a.endswith(".cu")), None)
    if source is not None and os.environ.get(lean.ENV) == "1":
        torch_form = any(torch_split.TORCH_INCLUDE.match(line)
                         for line in Path(source).read_text(errors="replace").split("\n")[3:])
        code = _torch_form(nvcc, args, source) if torch_form else _lean(nvcc, args, source)
        if code is not None:
            return code
    with tempfile.TemporaryDirectory(prefix="kloop-nvcc-") as tmp:
        # nvcc names its intermediates in TMPDIR after its pid, which is free again once the
        # dryrun has exited: a directory of this run's own keeps them apart from any other
        # nvcc's and takes them away at the end, as nvcc does (tens of MB for torch sources).
        work = Path(tmp) / "tmp"
        work.mkdir()
        env = {**os.environ, "TMPDIR": str(work)}
        planned = parts = None
        why = "no .cu source"
        if source is not None:
            try:
                planned = dryrun(nvcc, args, env)
                parts = split(planned.commands) if planned else None
                why = "no dryrun to split (nvcc refused the arguments or set variables " \
                    "between commands)" if planned is None else \
                    "not one architecture's host and device chains"
            except (OSError, ValueError) as exc:  # nothing to split: nvcc's own way
                planned, why = None, f"{type(exc).__name__}: {exc}"
        if planned is None or parts is None:
            _report(f"plain: {why}")
            return subprocess.run([nvcc, *args]).returncode
        _report("split")
        host, device, rest, id_file = parts
        prologue = "\n".join(_exports(planned.variables))
        sys.stderr.write(planned.said)  # nvcc's own warnings come before its tools' output
        Path(id_file).write_text(module_id(source))
        logs = [Path(tmp) / "host.log", Path(tmp) / "device.log"]
        hosting = _run_chain(prologue, host, logs[0], env)
        devicing = _run_chain(prologue, device, logs[1], env)
        # nvcc runs the host chain first and stops at the first failing command: so does this.
        if (code := hosting.wait()) != 0:
            _kill_tree(devicing.pid)
            devicing.wait()
            return _relay(logs[0], code)
        _relay(logs[0], 0)
        if (code := devicing.wait()) != 0:
            return _relay(logs[1], code)
        _relay(logs[1], 0)
        return subprocess.run([SHELL, "-c", _chain_script(prologue, rest)], env=env).returncode


def _lean(nvcc: str, args: list[str], source: str) -> int | None:
    """Build `source` lean (`evaluator.build.lean`): 0 if it built, passing on what it printed;
    None (and nothing printed) if it does not qualify or failed: then the plain way."""
    with tempfile.TemporaryDirectory(prefix="kloop-lean-") as tmp:
        found = lean.facts(nvcc, args, source, Path(tmp))
        text, why = lean.lean_source(Path(source), found, lambda names: lean.extra_refusal(
            nvcc, args, source, found, names, Path(tmp))) if found else (None, "no facts")
        if text is None:
            _report(f"lean refused: {why}")
            return None
        # Its own directory and the original's name: nvcc names the module id after the file.
        (Path(tmp) / "src").mkdir()
        lean_file = Path(tmp) / "src" / Path(source).name
        lean_file.write_text(text)
        env = {k: v for k, v in os.environ.items() if k not in (lean.ENV, REPORT_ENV)}
        r = subprocess.run([sys.executable, __file__, "--nvcc", nvcc,
                            *(str(lean_file) if a == source else a for a in args)],
                           capture_output=True, env=env)
        if r.returncode != 0:
            _report("lean failed: built the plain way")
            return None
        _report("lean")
        sys.stdout.buffer.write(r.stdout)
        sys.stderr.buffer.write(r.stderr)
        return 0


def _torch_form(nvcc: str, args: list[str], source: str) -> int | None:
    """Build a torch-form `source` as two halves (`evaluator.build.torch_form`): 0 if both
    built and joined, passing on what they printed; None (nothing printed) if it does not
    qualify or a half failed: then the plain way."""
    with tempfile.TemporaryDirectory(prefix="kloop-torchform-") as tmp:
        work = Path(tmp)
        try:
            why = _torch_form_build(nvcc, args, source, work)
        except (OSError, ValueError, subprocess.SubprocessError) as exc:  # no `ld`, a bad arg
            why = f"failed: {type(exc).__name__}: {exc} (built the plain way)"
        if why is None:
            return 0
        _report(f"torch form {why}")
        return None


def _torch_form_build(nvcc: str, args: list[str], source: str, work: Path) -> str | None:
    """None once the object is written, else `refused: why` or `failed: why`."""
    text = Path(source).read_text()
    lines = text.split("\n")
    if lines[:3] != lean.PROLOGUE:
        return "refused: not load_inline's prologue"
    try:
        halves = torch_split.split("\n".join(lines[3:]))
    except torch_split.Refused as exc:
        return f"refused: {exc}"
    host = host_compile(args, source)
    if isinstance(host, str):
        return f"refused: {host}"
    found = lean.facts(nvcc, args, source, work, halves.torch_includes)
    if found is None:
        return "refused: no lean facts for its torch includes"
    why = lean.refusal(halves.device, found, lambda names: lean.extra_refusal(
        nvcc, args, source, found, names, work))
    if why is not None:
        return f"refused: the device half: {why}"
    (work / "src").mkdir()
    dev_file = work / "src" / Path(source).name  # nvcc names the module id after the file
    dev_file.write_text(lean.prologue_text(found.headers) + f'#line 4 "{source}"\n'
                        + halves.device)
    host_file = work / "host.cpp"
    # The precompiled header serves only a first line; `#line 1` then keeps the candidate's
    # lines where they were in the original file.
    host_file.write_text(f'#include <{cxx_pch.HEADER}>\n#line 1 "{source}"\n'
                         + "\n".join(lean.PROLOGUE) + "\n" + halves.host)
    out = args[args.index("-o") + 1]
    dev_obj, host_obj = work / "device.o", work / "host.o"
    env = {k: v for k, v in os.environ.items() if k not in (lean.ENV, REPORT_ENV)}
    dev_args = [str(dev_file) if a == source else str(dev_obj) if a == out else a for a in args]
    command, pch_entry = host
    host_cmd = [*command, *(["-I", str(pch_entry)] if pch_entry else []), "-c", str(host_file),
                "-o", str(host_obj)]
    logs = [work / "device.log", work / "host.log"]
    with logs[0].open("wb") as f0, logs[1].open("wb") as f1:
        devicing = subprocess.Popen([sys.executable, __file__, "--nvcc", nvcc, *dev_args],
                                    stdout=f0, stderr=subprocess.STDOUT, env=env)
        hosting = subprocess.Popen(host_cmd, stdout=f1, stderr=subprocess.STDOUT, env=env)
        codes = devicing.wait(), hosting.wait()
    if codes != (0, 0):
        which = "the device half" if codes[0] else "the host half"
        return f"failed: {which} did not build (built the plain way)"
    joined = subprocess.run(["ld", "-r", "-o", out, str(dev_obj), str(host_obj)],
                            capture_output=True, text=True)
    if joined.returncode != 0:
        return f"failed: ld -r: {joined.stderr.strip()[:200]}"
    _report("torch form" + (" (host pch)" if pch_entry else " (host without pch)"))
    for log_file in logs:  # warnings, as nvcc passes its tools' output on
        sys.stderr.buffer.write(log_file.read_bytes())
    return None


_DEVICE_ONLY_FLAGS = {"--use_fast_math", "-use_fast_math", "-lineinfo", "--expt-relaxed-constexpr",
                      "--expt-extended-lambda", "--extended-lambda", "-res-usage",
                      "--resource-usage", "-Xptxas", "--ptxas-options", "-maxrregcount",
                      "--maxrregcount", "-gencode", "--generate-code", "-arch", "--gpu-architecture",
                      "-code", "--gpu-code"}


def host_compile(args: list[str], source: str) -> tuple[list[str], Path | None] | str:
    """The host compiler's command for the host half (without its input and output), and the
    precompiled header's directory when one was made under exactly those flags; or why the
    host half cannot be compiled as nvcc would have compiled it.

    The flags are the binding file's, as torch builds them (its common flags, `-fPIC`, the
    standard, the optimisation level nvcc gives its host compile): torch's common flags are
    the ones before its nvcc-only `-D__CUDA_NO_…` defines; the `-D`s and `-I`s of
    `extra_cuda_cflags` follow. Any flag this cannot place is refused."""
    common: list[str] = []
    extra: list[str] = []
    std, opt, cxx = None, None, "gcc"
    it = iter(a for a in args)
    in_common = True
    nvcc_only = {"-D__CUDA_NO_HALF_OPERATORS__", "-D__CUDA_NO_HALF_CONVERSIONS__",
                 "-D__CUDA_NO_BFLOAT16_CONVERSIONS__", "-D__CUDA_NO_HALF2_OPERATORS__"}
    for a in it:
        if a in nvcc_only:
            in_common = False
            continue
        if a in ("-c", source, "--generate-dependencies-with-compile"):
            continue
        if a in ("-o", "--dependency-output", "-MF"):
            next(it, None)
            continue
        if a == "-ccbin":
            cxx = next(it, "")
            continue
        if a in ("-isystem", "-I", "-D"):
            (common if in_common else extra).extend([a, next(it, "")])
            continue
        if a.startswith(("-I", "-D")):
            (common if in_common else extra).append(a)
            continue
        if a.startswith("-std="):
            std = a
            continue
        if a in ("-O0", "-O1", "-O2", "-O3"):
            opt = a
            continue
        if a in ("--compiler-options", "-Xcompiler"):
            value = next(it, "")
            if value.strip("'\"") != "-fPIC":
                return f"host compiler options {value!r}"
            continue
        name = a.split("=", 1)[0]
        if name in _DEVICE_ONLY_FLAGS:
            if "=" not in a and name in ("-Xptxas", "--ptxas-options", "-maxrregcount",
                                         "--maxrregcount", "-gencode", "--generate-code",
                                         "-arch", "--gpu-architecture", "-code", "--gpu-code"):
                next(it, None)
            continue
        return f"the nvcc flag {a!r}"
    if std is None:
        return "no -std flag"
    flags = [*common, "-fPIC", std, *([opt] if opt else []), *extra]
    real = os.environ.get(cxx_pch.REAL_ENV) or "c++"
    root = os.environ.get(cxx_pch.ROOT_ENV)
    keyed = [f for f in flags if not f.startswith("-DTORCH_EXTENSION_NAME=")]  # as the binding's
    entry = Path(root) / cxx_pch.pch_key(real, keyed) if root else None
    if entry is not None and not (entry / cxx_pch.READY).is_file():
        entry = None
    # nvcc's host compile is `gcc -x c++` (or -ccbin's); the PCH is g++'s own: the compiler
    # checks that it fits and reads the header when it does not.
    return [*shlex.split(cxx), "-x", "c++", "-Wno-psabi", *flags], entry


def _kill_tree(pid: int) -> None:
    """Kill a chain's shell and the tool it is running (they share our process group, so a
    timeout that kills the build's group still reaches them; here only the chain goes)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    todo, tree = [pid], []
    while todo:
        tree.append(todo.pop())
        todo.extend(children.get(tree[-1], []))
    for p in tree:
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _relay(log: Path, code: int) -> int:
    """A chain's output to our stderr, as nvcc passes its tools' output on; returns `code`."""
    sys.stderr.buffer.write(log.read_bytes())
    sys.stderr.flush()
    return code


def _report(outcome: str) -> None:
    """One line per run to the file `KLOOP_NVCC_REPORT` names (kloop's build records what
    happened: `split` or `plain: <why>`)."""
    path = os.environ.get(REPORT_ENV)
    if not path:
        return
    try:
        with open(path, "a") as f:
            f.write(outcome.replace("\n", " ") + "\n")
    except OSError:  # a report is never worth a failed build
        pass


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
