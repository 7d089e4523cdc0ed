"""Triton launch recording under the interpreter, then AOT compilation of exactly those
specialisations for sm_90 — catching kernels the interpreter accepts but the GPU compiler or the
launch would reject.

The interpreter must be on before `triton.language` is first imported, so the candidates run in
one subprocess per module (a few seconds), which reports everything as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from kloop.evaluator.build.triton_aot import TritonLaunch
from kloop.evaluator.common.result import CompileLog, ProfileSummary

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).parent / "fixtures_e2"

DRIVER = r"""
import importlib.util, json, os, sys
from pathlib import Path
os.environ["TRITON_INTERPRET"] = "1"
import torch
from kloop.evaluator.build import triton_aot as ta
from kloop.evaluator.common.backend import custom_kernel_names
from kloop.evaluator.worker.profile import profile_forward

fixtures, work = Path(sys.argv[1]), Path(sys.argv[2])
assert ta.install_triton_launch_recorder()
torch.manual_seed(0)
x = torch.randn(1000)
a8, b8 = torch.randn(8, 8), torch.randn(8, 8)
a, b = torch.randn(64, 256), torch.randn(256, 64)
cases = {
    "triton_scale_ok.py": ([x], torch.relu(2 * x), 3),
    "triton_small_dot.py": ([a8, b8], a8 @ b8, 1),
    "triton_big_tiles.py": ([a, b], a @ b, 1),
}
out = {}
for name, (inputs, expected, calls) in cases.items():
    ta.clear_recorded_launches()
    path = fixtures / name
    spec = importlib.util.spec_from_file_location(name[:-3], path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    model = mod.ModelNew()
    for _ in range(calls):
        got = model(*inputs)
    launches = [l.model_dump(mode="json") for l in ta.recorded_launches()]
    log = ta.triton_aot_check(candidate_path=path, work_dir=work / name)
    prof = profile_forward(model, inputs, "cpu", custom_kernel_names(path.read_text()))
    out[name] = {
        "max_err": float((got - expected).abs().max()),
        "launches": launches,
        "log": log.model_dump(mode="json"),
        "profile": prof.model_dump(mode="json"),
    }
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("triton-aot")
    env = {**os.environ, "PYTHONPATH": str(REPO), "TRITON_CACHE_DIR": str(work / "cache")}
    env.pop("TRITON_INTERPRET", None)
    res = subprocess.run([sys.executable, "-c", DRIVER, str(FIXTURES), str(work)], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-4000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_launches_are_recorded_once_per_specialisation(runs):
    run = runs["triton_scale_ok.py"]
    assert run["max_err"] < 1e-6
    [launch] = [TritonLaunch.model_validate(x) for x in run["launches"]]
    assert launch.kernel == "scale_relu_kernel"
    assert launch.signature == {"x_ptr": "*fp32", "y_ptr": "*fp32", "n": "i32",
                                "BLOCK": "constexpr"}
    assert launch.constexprs == {"BLOCK": 256}
    assert launch.options == {"num_warps": 4}
    assert launch.calls == 3
    assert set(launch.divisible_16) >= {"x_ptr", "y_ptr"}


def test_honest_kernel_compiles_for_sm90_with_resources(runs):
    log = CompileLog.model_validate(runs["triton_scale_ok.py"]["log"])
    assert log.ok and log.target == "sm_90" and log.diagnostics == []
    [res] = log.resources
    assert res.kernel == "scale_relu_kernel" and res.registers and res.registers > 0


def test_dot_that_only_the_interpreter_accepts_is_a_located_compile_error(runs):
    run = runs["triton_small_dot.py"]
    assert run["max_err"] < 1e-4  # the interpreter computed the right answer...
    log = CompileLog.model_validate(run["log"])
    assert not log.ok and log.infra_error is None  # ...but sm_90 rejects the kernel
    [diag] = log.diagnostics
    assert "K >= 16" in diag.message
    assert diag.file == "triton_small_dot.py"
    line = (FIXTURES / "triton_small_dot.py").read_text().splitlines()[diag.line - 1]
    assert "tl.dot(" in line


def test_shared_memory_overflow_is_caught_after_an_interpreter_run(runs):
    # This kernel calls tl.zeros, a @jit library function: the interpreter leaves
    # triton.language patched afterwards, which the AOT compile must not see.
    run = runs["triton_big_tiles.py"]
    assert run["max_err"] < 1e-3
    log = CompileLog.model_validate(run["log"])
    assert not log.ok
    [diag] = log.diagnostics
    assert "shared memory" in diag.message and "232448" in diag.message
    assert log.resources[0].shared_bytes > 232448


def test_cpu_profile_attributes_interpreter_time_to_the_custom_kernel(runs):
    prof = ProfileSummary.model_validate(runs["triton_scale_ok.py"]["profile"])
    assert prof.activity == "cpu"
    kinds = {k.name: k.kind for k in prof.kernels}
    assert kinds["scale_relu_kernel"] == "custom"
    assert prof.custom_share is not None and 0.5 < prof.custom_share <= 1.0
    assert abs(sum(k.share for k in prof.kernels) - 1.0) < 1e-6
