"""The content-addressed load_inline cache: misses build privately and publish atomically, hits
import directly, concurrent builders never collide, failures leave nothing behind."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from kloop.evaluator.build import buildcache

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures_e2"

# pybind11 only (no torch/extension.h): the cheapest extension that exercises the real build.
CPU_EXT = """#include <pybind11/pybind11.h>
int twice(int x) { return 2 * x; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("twice", &twice); }
"""

CPU_SCRIPT = f"""
import json, sys
from pathlib import Path
from kloop.evaluator.build import buildcache
buildcache.install_load_inline_cache(Path(sys.argv[1]), arch=None)
from torch.utils.cpp_extension import load_inline
m = load_inline(name="kloop_cpu_twice", cpp_sources={CPU_EXT!r}, no_implicit_headers=True)
rec = buildcache.BUILD_RECORDS[-1]
print(json.dumps({{"value": m.twice(21), "record": rec.model_dump(mode="json")}}))
"""

GPU_SCRIPT = """
import json, runpy, sys
from pathlib import Path
import torch
from kloop.evaluator.build import buildcache
buildcache.install_load_inline_cache(Path(sys.argv[1]), arch=None)
ns = runpy.run_path(sys.argv[2])
a = torch.randn(1000, device="cuda"); b = torch.randn(1000, device="cuda")
ok = bool(torch.allclose(ns["ModelNew"]()(a, b), a + b))
rec = buildcache.BUILD_RECORDS[-1]
print(json.dumps({"value": ok, "record": rec.model_dump(mode="json")}))
"""


def _spawn(script: str, *args: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen([sys.executable, "-c", script, *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)


def _result(proc: subprocess.Popen, timeout: float = 600) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def _leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*") if p.name == "lock" or p.name.startswith(".tmp-"))


@pytest.mark.slow
def test_concurrent_misses_publish_one_entry_and_the_next_process_hits(tmp_path):
    root = tmp_path / "cache"
    racers = [_spawn(CPU_SCRIPT, str(root)) for _ in range(2)]
    first = [_result(p) for p in racers]
    assert [r["value"] for r in first] == [42, 42]
    assert [r["record"]["cache_hit"] for r in first] == [False, False]
    keys = {r["record"]["key"] for r in first}
    assert len(keys) == 1
    entries = [p for p in root.iterdir() if not p.name.startswith(".") and p.name != "logs"]
    assert [p.name for p in entries] == list(keys)
    assert (entries[0] / buildcache.META_FILE).is_file()
    assert not list(entries[0].glob("*.o"))
    assert _leftovers(root) == []

    hit = _result(_spawn(CPU_SCRIPT, str(root)))
    assert hit["value"] == 42 and hit["record"]["cache_hit"] is True
    assert hit["record"]["seconds"] < 0.2 * first[0]["record"]["seconds"]


def test_failed_build_records_mapped_errors_and_publishes_nothing(tmp_path):
    root = tmp_path / "cache"
    candidate = (
        "from torch.utils.cpp_extension import load_inline\n"
        'SRC = """int twice(int x) {\n'
        "    return 2 * y;\n"
        '}\n"""\n'
    )
    bad = "int twice(int x) {\n    return 2 * y;\n}\n"
    before = len(buildcache.BUILD_RECORDS)
    buildcache.install_load_inline_cache(root, arch=None, candidate_source=candidate,
                                         candidate_name="candidate.py")
    try:
        from torch.utils.cpp_extension import load_inline

        with pytest.raises(RuntimeError, match="Error building extension"):
            load_inline(name="kloop_cpu_broken", cpp_sources=bad, no_implicit_headers=True)
    finally:
        buildcache.uninstall()
    [record] = buildcache.BUILD_RECORDS[before:]
    assert not record.ok and not record.cache_hit and record.compile is not None
    [diag] = [d for d in record.compile.diagnostics if "'y'" in d.message]
    assert (diag.file, diag.line) == ("candidate.py", 3)
    assert Path(record.compile.log_path).is_file()
    assert sorted(p.name for p in root.iterdir()) == ["logs"]


def test_key_tracks_what_changes_the_binary():
    base = {"name": "e", "cpp_sources": ["a"], "cuda_sources": ["b"], "functions": ["f"],
            "extra_cuda_cflags": None, "build_directory": "/x", "verbose": False}
    key = buildcache.build_key(base, "sm_90", "f" * 64)
    same = {**base, "build_directory": "/y", "verbose": True}
    assert buildcache.build_key(same, "sm_90", "f" * 64) == key
    assert buildcache.build_key({**base, "cuda_sources": ["b "]}, "sm_90", "f" * 64) != key
    assert buildcache.build_key({**base, "extra_cuda_cflags": ["-O3"]}, "sm_90", "f" * 64) != key
    assert buildcache.build_key(base, "sm_100", "f" * 64) != key
    # Another candidate file with the same call never shares the build.
    assert buildcache.build_key(base, "sm_90", "e" * 64) != key


PARALLEL_NVCC_SCRIPT = """
import json, os, sys
from torch.utils import cpp_extension
from kloop.evaluator.build import buildcache
cpp_extension.CUDA_HOME = sys.argv[1] or None  # what a CUDA build of torch finds (CPU: None)
print(json.dumps({"env": buildcache.parallel_nvcc_env(), "left": os.environ.get("PYTORCH_NVCC")}))
"""


def _parallel_nvcc_env(cuda_home: str, **env: str) -> dict:
    base = {k: v for k, v in os.environ.items() if k != "PYTORCH_NVCC"}
    r = subprocess.run([sys.executable, "-c", PARALLEL_NVCC_SCRIPT, cuda_home], cwd=REPO,
                       env={**base, **env}, capture_output=True, text=True, check=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_torchs_build_calls_the_parallel_nvcc_unless_the_user_chose_one():
    homes = (os.environ.get("CUDA_HOME"), "/usr/local/cuda", "/usr/local/cuda-13.0")
    home = next((h for h in homes if h and (Path(h) / "bin" / "nvcc").is_file()), None)
    if home is None:
        pytest.skip("no CUDA home with bin/nvcc")
    got = _parallel_nvcc_env(home)
    assert got["env"]["TORCH_EXTENSION_SKIP_NVCC_GEN_DEPENDENCIES"] == "1"
    nvcc = got["env"]["PYTORCH_NVCC"]
    assert str(buildcache.NVCC_PARALLEL) in nvcc and f"--nvcc {home}/bin/nvcc" in nvcc
    assert got["left"] is None  # only returned: the build sets it for its own duration
    got = _parallel_nvcc_env(home, PYTORCH_NVCC="ccache nvcc")
    assert (got["env"], got["left"]) == ({}, "ccache nvcc")
    assert _parallel_nvcc_env("")["env"] == {}


CPU_SCRIPT_ENV_AFTER = """
import json, os, sys
from pathlib import Path
from kloop.evaluator.build import buildcache
buildcache.install_load_inline_cache(Path(sys.argv[1]), arch=None)
from torch.utils.cpp_extension import load_inline
load_inline(name="kloop_cpu_twice_env", cpp_sources={src!r}, no_implicit_headers=True)
print(json.dumps({{k: os.environ.get(k) for k in ("KLOOP_NVCC_REPORT", "PYTORCH_NVCC")}}))
"""


def test_a_build_in_the_callers_process_leaves_its_environment_as_it_was(tmp_path):
    proc = _spawn(CPU_SCRIPT_ENV_AFTER.format(src=CPU_EXT), str(tmp_path / "cache"))
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1]) == {"KLOOP_NVCC_REPORT": None,
                                                        "PYTORCH_NVCC": None}


def test_arch_spellings():
    for spelling in ("sm_90", "9.0", "90"):
        assert buildcache.normalise_arch(spelling) == "sm_90"
    assert buildcache.normalise_arch("9.0a") == "sm_90a"
    assert buildcache.normalise_arch("10.0") == "sm_100"
    assert buildcache.normalise_arch("8.0;9.0+PTX") == "8.0;9.0+PTX"
    assert buildcache.normalise_arch("") is None


@pytest.mark.gpu
def test_cuda_extension_second_load_is_a_fast_hit(tmp_path):
    root = tmp_path / "cache"
    fixture = str(FIXTURES / "cuda_add_ok.py")
    miss = _result(_spawn(GPU_SCRIPT, str(root), fixture))
    hit = _result(_spawn(GPU_SCRIPT, str(root), fixture))
    assert miss["value"] and hit["value"]
    assert (miss["record"]["cache_hit"], hit["record"]["cache_hit"]) == (False, True)
    assert hit["record"]["seconds"] < 1.0 < miss["record"]["seconds"]
    # Built through evaluator.build.nvcc_parallel, its chains side by side.
    assert miss["record"]["nvcc_runs"] == ["split"]
    print(f"build {miss['record']['seconds']:.1f} s, cached load {hit['record']['seconds']:.3f} s")


@pytest.mark.gpu
def test_a_killed_build_leaves_no_lock_and_the_next_build_succeeds(tmp_path):
    root = tmp_path / "cache"
    fixture = str(FIXTURES / "cuda_add_ok.py")
    victim = _spawn(GPU_SCRIPT, str(root), fixture)
    deadline = time.monotonic() + 120
    while not list(root.glob(".tmp-*/cuda.cu")) and time.monotonic() < deadline:
        time.sleep(0.2)
    time.sleep(2.0)  # nvcc is running now
    assert victim.poll() is None, "the build finished before it could be killed"
    os.killpg(victim.pid, signal.SIGKILL)
    victim.wait()
    assert [p for p in root.iterdir() if not p.name.startswith(".")] == []
    again = _result(_spawn(GPU_SCRIPT, str(root), fixture), timeout=600)
    assert again["value"] and again["record"]["cache_hit"] is False
