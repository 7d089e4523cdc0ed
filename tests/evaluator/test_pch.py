"""The precompiled torch header of `load_inline`'s binding file (evaluator.build.pch, cxx_pch):
made only by trusted code under torch's own flags, used by g++ only where valid, the same binary
as the plain build, and out of every candidate's reach."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from evaluator.build import cxx_pch, pch

REPO = Path(__file__).resolve().parents[2]
VARIANT = pch.Variant(False, ("-O3",))
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


# ---- with a real PCH (one build per module, ~50 s on a 2-core host) -------------------------


@pytest.fixture(scope="module")
def store():
    """A store as the harness makes it (vault-owned under root), somewhere sandbox uids can
    reach, with the PCH of `VARIANT` built by the trusted builder."""
    base = Path(tempfile.mkdtemp(prefix="kloop-pch-test-"))
    base.chmod(0o755)
    before = os.environ.get(pch.DIR_ENV)
    os.environ[pch.DIR_ENV] = str(base / "store")
    try:
        root = pch.store_dir()
        assert root is not None
        key = pch.build(root, VARIANT)
        assert key is not None, "the trusted builder made no PCH"
        yield root, key
    finally:
        if before is None:
            os.environ.pop(pch.DIR_ENV, None)
        else:
            os.environ[pch.DIR_ENV] = before
        shutil.rmtree(base, ignore_errors=True)


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
# Honest but unusual: no implicit header, another include first: g++ cannot take the PCH here
# and must read the real header through the forwarding one.
LATE = ("#include <vector>\n#include <torch/extension.h>\n"
        "torch::Tensor twice(torch::Tensor x) { std::vector<int> v{2}; return x * v[0]; }\n")


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
def test_the_binding_built_with_the_pch_is_the_plain_binary(tmp_path, store):
    root, key = store
    with_pch = _build(tmp_path, "ext_one", BINDING, root)
    plain = _build(tmp_path, "ext_two", BINDING, None)
    assert _done(with_pch) == _done(plain) == [0.0, 2.0, 4.0]
    assert (tmp_path / "ext_one.report").read_text().split() == ["pch"]
    assert not (tmp_path / "ext_two.report").exists()  # no wrapper at all
    # The same code and data (the PCH was made without the extension's name, which the
    # binding still carries: the module imported under it above).
    assert _code(tmp_path / "ext_one" / "main.o") == _code(tmp_path / "ext_two" / "main.o")
    late = _build(tmp_path, "ext_late", LATE, root, no_implicit=True)
    assert _done(late) == [0.0, 2.0, 4.0]
    # Offered, not taken: another include came first, so g++ read the real header.
    assert (tmp_path / "ext_late.report").read_text().splitlines() == [
        "plain: g++ did not take the precompiled header"]


# ---- through the evaluator ------------------------------------------------------------------

E2E = '''"""L3/1 with a host-side helper built by load_inline (no CUDA sources on this machine)."""
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

ext = load_inline(name="kloop_pch_e2e", cpp_sources="torch::Tensor twice(torch::Tensor x) "
                  "{ return x * 2; }", cuda_sources=[], functions=["twice"], extra_cflags=["-O3"])


class ModelNew(nn.Module):
    def __init__(self, input_size, layer_sizes, output_size):
        super().__init__()
        layers, current = [], input_size
        for hidden in layer_sizes:
            layers += [nn.Linear(current, hidden), nn.ReLU()]
            current = hidden
        layers.append(nn.Linear(current, output_size))
        self.network = nn.Sequential(*layers)

    def forward(self, x):
        return ext.twice(self.network(x)) / 2
'''

# The cheapest attacks on the store from candidate code (the compile child runs it at import):
# rewrite the PCH, take its marker away, move the entry, plant an entry of its own.
TAMPER = '''
import json, os, pathlib
root = pathlib.Path(os.environ["KLOOP_PCH_ROOT"])
tried, refused = 0, 0
for entry in [p for p in root.iterdir() if not p.name.startswith(".")]:
    for attempt in (
        lambda: open(entry / "torch" / "extension.h.gch", "r+b").write(b"forged"),
        lambda: (entry / "ready").unlink(),
        lambda: os.chmod(entry, 0o777),
        lambda: os.rename(entry, root / "moved"),
        lambda: (root / ("f" * 64)).mkdir(),
    ):
        tried += 1
        try:
            attempt()
        except OSError:
            refused += 1
with open(pathlib.Path(DROP) / f"log.{os.getpid()}", "a") as f:
    f.write(json.dumps({"tried": tried, "refused": refused}) + "\\n")
'''


def _state(root: Path) -> dict[str, tuple]:
    return {str(p.relative_to(root)): (p.stat().st_ino, p.stat().st_size, p.stat().st_mtime_ns,
                                       p.stat().st_mode)
            for p in [root, *root.rglob("*")] if not p.name.startswith(".")}


@pytest.mark.slow
@needs_gxx
def test_a_candidates_build_takes_the_pch_and_cannot_touch_the_store(tmp_path, store, drop_box):
    from eval_helpers import cpu_config, drop_rows

    from evaluator import isolation
    from evaluator.pipeline import evaluate

    root, key = store
    config = cpu_config(tmp_path / "cache")
    honest = evaluate("L3/1", E2E, config)
    assert (honest.status, honest.backend) == ("not_run", "cuda"), honest.error
    assert honest.compile is not None and honest.compile.ok
    assert honest.compile.cxx_runs == ["pch"]
    if not (isolation.can_change_uid() or isolation.userns_works()):
        pytest.skip("children share the harness's uid here and may write what it writes")
    before = _state(root)
    attacker = evaluate("L3/1", E2E.replace("kloop_pch_e2e", "kloop_pch_tamper")
                        + f"DROP = {str(drop_box)!r}\n" + TAMPER, config)
    assert attacker.compile is not None and attacker.compile.cxx_runs == ["pch"]
    assert _state(root) == before
    rows = drop_rows(drop_box / "log")
    assert rows and all(r["tried"] >= 5 and r["refused"] == r["tried"] for r in rows), rows


def test_background_builders_run_sched_idle_and_leave_the_caller_alone(tmp_path, monkeypatch):
    seen: list[int] = []
    monkeypatch.setenv(pch.DIR_ENV, str(tmp_path / "store"))
    monkeypatch.setattr(pch, "build", lambda root, variant: seen.append(os.sched_getscheduler(0)))
    before = os.sched_getscheduler(0)
    pch.ensure(pch.default_variants(cuda=False))
    assert seen == [os.SCHED_IDLE, os.SCHED_IDLE]  # and what they start inherits it
    assert os.sched_getscheduler(0) == before
