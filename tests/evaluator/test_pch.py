"""The precompiled torch header of `load_inline`'s binding file (evaluator.build.pch, cxx_pch):
made only by trusted code under torch's own flags, used by g++ only where valid, the same binary
as the plain build. Out of every candidate's reach, and an unusual honest binding that g++ cannot
take it for: tests/exploits/test_pch_store.py."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from kloop.evaluator.build import cxx_pch, pch

REPO = Path(__file__).resolve().parents[2]
needs_gxx = pytest.mark.skipif(shutil.which("c++") is None, reason="needs a host C++ compiler")

NINJA_ARGS = ["-MMD", "-MF", "main.o.d", "-DTORCH_EXTENSION_NAME=cand_a",
              "-DTORCH_API_INCLUDE_EXTENSION_H", "-isystem", "/t/include", "-fPIC", "-std=c++20",
              "-O3", "-c", "/b/main.cpp", "-o", "main.o"]


def test_only_the_binding_compile_has_flags_and_the_name_is_not_in_the_key():
    flags = cxx_pch.binding_flags(NINJA_ARGS)
    assert flags == ["-DTORCH_API_INCLUDE_EXTENSION_H", "-isystem", "/t/include", "-fPIC",
                     "-std=c++20", "-O3"]
    other = [a.replace("cand_a", "cand_b") for a in NINJA_ARGS]
    assert cxx_pch.pch_key("c++", cxx_pch.binding_flags(other)) == cxx_pch.pch_key("c++", flags)
    # Any other flag is another key: a PCH is only ever tried under its own flags.
    o2 = [("-O2" if a == "-O3" else a) for a in NINJA_ARGS]
    assert cxx_pch.pch_key("c++", cxx_pch.binding_flags(o2)) != cxx_pch.pch_key("c++", flags)
    assert cxx_pch.pch_key("g++-12", flags) != cxx_pch.pch_key("c++", flags)
    # The link, version queries, nvcc's objects and other sources are not the binding compile.
    assert cxx_pch.binding_flags(["main.o", "cuda.cuda.o", "-shared", "-o", "x.so"]) is None
    assert cxx_pch.binding_flags(["-dumpfullversion", "-dumpversion"]) is None
    assert cxx_pch.binding_flags(["-c", "other.cpp", "-o", "other.o"]) is None
    assert cxx_pch.binding_flags(["-c", "main.cpp", "extra.cpp", "-o", "main.o"]) is None


def _run_wrapper(tmp: Path, args: list[str], root: Path | None) -> tuple[subprocess.
                                                                          CompletedProcess, list[str]]:
    report = tmp / "report.txt"
    report.unlink(missing_ok=True)
    env = {**os.environ, **pch.compiler_env(tmp, root, report)} if root else {
        **os.environ, "CXX": str(pch.launcher(tmp)), cxx_pch.REAL_ENV: "c++",
        cxx_pch.REPORT_ENV: str(report)}
    r = subprocess.run([env["CXX"], *args], cwd=tmp, env=env, capture_output=True, text=True)
    return r, report.read_text().splitlines() if report.exists() else []


@needs_gxx
def test_the_wrapper_is_the_real_compiler_for_everything_else(tmp_path):
    (tmp_path / "main.cpp").write_text("int f() { return 41 + 1; }\n")
    real = subprocess.run(["c++", "-dumpfullversion", "-dumpversion"], capture_output=True,
                          text=True)
    r, report = _run_wrapper(tmp_path, ["-dumpfullversion", "-dumpversion"], None)
    assert (r.returncode, r.stdout) == (0, real.stdout) and report == []
    # The binding compile with no store, then with a store that lacks these flags: plain.
    r, report = _run_wrapper(tmp_path, ["-O3", "-c", "main.cpp", "-o", "main.o"], None)
    assert r.returncode == 0 and (tmp_path / "main.o").is_file()
    assert report == ["plain: no precompiled header for these flags"]
    root = tmp_path / "store"
    root.mkdir()
    r, report = _run_wrapper(tmp_path, ["-O3", "-c", "main.cpp", "-o", "main.o"], root)
    assert r.returncode == 0 and report == ["plain: no precompiled header for these flags"]
    # A ready entry under exactly these flags is offered; this file never includes the header,
    # which the report says (a compile that takes one is tested below).
    key = cxx_pch.pch_key("c++", ["-O3"])
    (root / key).mkdir()
    (root / key / cxx_pch.READY).write_text("")
    r, report = _run_wrapper(tmp_path, ["-O3", "-c", "main.cpp", "-o", "main.o"], root)
    assert r.returncode == 0 and report == ["plain: the file does not include the header"]
    # A failing compile fails the same way through the wrapper.
    (tmp_path / "main.cpp").write_text("int f() { return nope; }\n")
    r, _ = _run_wrapper(tmp_path, ["-O3", "-c", "main.cpp", "-o", "main.o"], root)
    assert r.returncode != 0 and "nope" in r.stderr


def test_a_build_dir_torch_cannot_name_unquoted_builds_the_plain_way(tmp_path):
    odd = tmp_path / "a (b)"
    odd.mkdir()
    assert pch.compiler_env(odd, tmp_path, tmp_path / "r") == {}
    assert "CXX" in pch.compiler_env(tmp_path, tmp_path, tmp_path / "r")


def test_a_store_someone_else_can_write_is_not_used(tmp_path, monkeypatch):
    shared = tmp_path / "open"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    monkeypatch.setenv(pch.DIR_ENV, str(shared))
    assert pch.store_dir() is None
    target = tmp_path / "elsewhere"
    target.mkdir()
    link = tmp_path / "link"
    link.symlink_to(target)
    monkeypatch.setenv(pch.DIR_ENV, str(link))
    assert pch.store_dir() is None
    monkeypatch.setenv(pch.DIR_ENV, str(tmp_path / "fresh"))
    made = pch.store_dir()
    assert made is not None and (made.stat().st_mode & 0o777) == 0o755


# ---- with a real PCH (`pch_store`: one build per session, ~50 s on a 2-core host) --------

BUILD = r"""
import json, os, sys
from torch.utils.cpp_extension import load_inline
name, build, cpp, no_implicit = sys.argv[1:5]
m = load_inline(name, cpp_sources=cpp, functions=["twice"], build_directory=build,
                extra_cflags=["-O3"], no_implicit_headers=no_implicit == "1")
import torch
print(json.dumps(m.twice(torch.arange(3.0)).tolist()))
"""

BINDING = "#include <torch/torch.h>\ntorch::Tensor twice(torch::Tensor x) { return x * 2; }\n"


def _build(tmp: Path, label: str, cpp: str, root: Path | None, no_implicit: bool = False,
           name: str = "kloop_pch_twice") -> subprocess.Popen:
    build = tmp / label
    build.mkdir()
    report = tmp / f"{label}.report"
    env = {**os.environ, "PYTHONPATH": str(REPO), **pch.compiler_env(build, root, report)}
    return subprocess.Popen([sys.executable, "-c", BUILD, name, str(build), cpp,
                             "1" if no_implicit else "0"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _done(p: subprocess.Popen) -> list[float]:
    out, err = p.communicate(timeout=600)
    assert p.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def _code(obj: Path) -> str:
    """The object's code and data (objdump's first lines name the file)."""
    text = subprocess.run(["objdump", "-d", "-s", str(obj)], capture_output=True, text=True,
                          check=True).stdout
    return "\n".join(text.splitlines()[3:])


@pytest.mark.slow
@needs_gxx
@pytest.mark.skipif(shutil.which("objdump") is None, reason="needs objdump")
def test_the_binding_built_with_the_pch_is_the_plain_binary(tmp_path, pch_store):
    root, key = pch_store
    with_pch = _build(tmp_path, "ext_one", BINDING, root)
    plain = _build(tmp_path, "ext_two", BINDING, None)
    assert _done(with_pch) == _done(plain) == [0.0, 2.0, 4.0]
    assert (tmp_path / "ext_one.report").read_text().split() == ["pch"]
    assert not (tmp_path / "ext_two.report").exists()  # no wrapper at all
    # The same code and data (the PCH was made without the extension's name, which the
    # binding still carries: the module imported under it above).
    assert _code(tmp_path / "ext_one" / "main.o") == _code(tmp_path / "ext_two" / "main.o")


def test_background_builders_run_sched_idle_and_leave_the_caller_alone(tmp_path, monkeypatch):
    seen: list[int] = []
    monkeypatch.setenv(pch.DIR_ENV, str(tmp_path / "store"))
    monkeypatch.setattr(pch, "build", lambda root, variant: seen.append(os.sched_getscheduler(0)))
    before = os.sched_getscheduler(0)
    pch.ensure(pch.default_variants(cuda=False))
    assert seen == [os.SCHED_IDLE, os.SCHED_IDLE]  # and what they start inherits it
    assert os.sched_getscheduler(0) == before
