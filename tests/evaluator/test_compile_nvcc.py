"""nvcc compile checks of torch CUDA-extension sources on a machine without a GPU.

A check of a source that includes torch's headers costs 10-70 s on two cores, so the two real
ones share a module-scoped cache and every other test here reuses their results.
"""

from __future__ import annotations

import ast
import runpy
import shutil
from pathlib import Path

import pytest
from kloop.evaluator.build import buildcache
from kloop.evaluator.build.nvcc import CHECK_CACHE_ENV, nvcc_check

FIXTURES = Path(__file__).parent / "fixtures_e2"

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")


def strings(source: str) -> dict[str, str]:
    return {
        n.targets[0].id: n.value.value
        for n in ast.parse(source).body
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
    }


@pytest.fixture(scope="module")
def check_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("nvcc-check-cache")


def check_fixture(name: str, work: Path, cache: Path):
    source = (FIXTURES / name).read_text()
    s = strings(source)
    return nvcc_check(s["cuda_source"], s["cpp_source"], None, work, functions=["add_cuda"],
                      candidate_source=source, candidate_name="candidate.py", cache_dir=cache)


@pytest.mark.slow
def test_valid_extension_passes_and_the_second_check_is_cached(tmp_path, check_cache):
    first = check_fixture("cuda_add_ok.py", tmp_path / "a", check_cache)
    assert first.ok, first.log_tail
    assert first.infra_error is None and first.diagnostics == []
    assert first.target == "sm_90"
    [res] = [r for r in first.resources if r.kernel in ("add_kernel", "_Z10add_kernelPKfS0_Pfi")]
    assert res.registers and res.registers > 0 and res.spill_bytes == 0
    second = check_fixture("cuda_add_ok.py", tmp_path / "b", check_cache)
    assert second.ok and second.cache_hit and second.seconds == 0.0
    assert not first.cache_hit


@pytest.mark.slow
def test_broken_extension_reports_device_host_and_binding_errors(tmp_path, check_cache):
    log = check_fixture("cuda_add_broken.py", tmp_path, check_cache)
    assert not log.ok and log.infra_error is None
    located = {(d.file, d.line) for d in log.diagnostics}
    assert ("candidate.py", 8) in located  # `scale` undefined inside the kernel
    assert ("candidate.py", 13) in located  # Tensor assigned to int in host code
    # cpp_sources declares add_cuda with a third parameter the definition lacks
    assert any("'add_cuda'" in d.message and "declaration in cpp_sources" in d.message
               for d in log.diagnostics)
    assert Path(log.log_path).read_text().count("error") >= 3


@pytest.mark.slow
def test_load_inline_in_check_mode_raises_past_the_candidates_except(tmp_path, check_cache,
                                                                     monkeypatch):
    monkeypatch.setenv(CHECK_CACHE_ENV, str(check_cache))
    source = (FIXTURES / "cuda_add_ok.py").read_text()
    # The candidate swallows every Exception around its build; the signal must still get out.
    guarded = source.replace("add_ext = load_inline(", "try:\n    add_ext = load_inline(", 1)
    guarded = guarded.replace("    verbose=False,\n)\n",
                              "    verbose=False,\n)\nexcept Exception:\n    add_ext = None\n", 1)
    assert "except Exception" in guarded
    path = tmp_path / "candidate.py"
    path.write_text(guarded)
    before = len(buildcache.BUILD_RECORDS)
    buildcache.install_compile_check_only(tmp_path / "build", tmp_path / "nvcc",
                                          candidate_source=guarded, candidate_name="candidate.py")
    try:
        with pytest.raises(buildcache.CudaNotAvailable) as info:
            runpy.run_path(str(path))
    finally:
        buildcache.uninstall()
    assert info.value.compile_log.ok
    [record] = buildcache.BUILD_RECORDS[before:]
    assert record.mode == "check" and record.ok and record.name == "kloop_fixture_add"
    assert record.compile == info.value.compile_log


def test_missing_sdk_header_is_an_infrastructure_note(tmp_path):
    log = nvcc_check("#include <cublas_kloop_absent.h>\n", None, None, tmp_path,
                     no_implicit_headers=True, cache_dir=tmp_path / "cache")
    assert not log.ok
    assert log.infra_error and "cublas_kloop_absent.h" in log.infra_error
    assert log.diagnostics == []


def test_missing_candidate_header_is_the_candidates_error(tmp_path):
    log = nvcc_check('#include "my_helpers.cuh"\n', None, None, tmp_path,
                     no_implicit_headers=True, cache_dir=tmp_path / "cache")
    assert not log.ok and log.infra_error is None
    assert any("my_helpers.cuh" in d.message for d in log.diagnostics)


@pytest.mark.slow
def test_cuda_context_include_is_checked_completely(tmp_path):
    """`ATen/cuda/CUDAContext.h` needs the cuBLAS/cuSPARSE/cuSOLVER headers that
    scripts/cuda_headers.sh installs: with them, a type error is reported at the candidate's line
    and a correct file gets a complete check."""
    from eval_helpers import candidate, cpu_config
    from kloop.evaluator.harness.pipeline import evaluate_many

    ok, broken = evaluate_many(
        [("L3/1", candidate("mlp_cuda_context_ok.py")),
         ("L3/1", candidate("mlp_cuda_context_type_error.py"))],
        cpu_config(tmp_path / "cache"), max_workers=2)
    assert (ok.status, ok.stage_reached) == ("not_run", "compile"), ok.compile
    assert "compile_check_incomplete" not in ok.flags
    assert ok.compile is not None and ok.compile.ok and ok.compile.infra_error is None

    assert (broken.status, broken.stage_reached) == ("compile_error", "compile")
    assert broken.compile is not None and broken.compile.infra_error is None
    [diag] = broken.compile.diagnostics
    assert (diag.file, diag.line) == ("candidate.py", 23)
    assert '"void *" is incompatible with parameter of type "float *"' in diag.message


def test_the_toolkit_headers_are_found_through_a_wrapper_nvcc(tmp_path, monkeypatch):
    """g++'s check of main.cpp needs the toolkit's headers (`<c10/cuda/CUDAStream.h>` includes
    `cuda_runtime_api.h`); an `nvcc` on PATH that is a wrapper script has no toolkit beside it,
    so they come from nvcc's own `--dryrun`."""
    from kloop.evaluator.build import nvcc

    wrapper = tmp_path / "bin" / "nvcc"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {shutil.which("nvcc")} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper.parent}:{__import__('os').environ['PATH']}")
    nvcc._toolkit_include_dirs.cache_clear()
    try:
        dirs = nvcc._toolkit_include_dirs()
    finally:
        nvcc._toolkit_include_dirs.cache_clear()
    assert any((Path(d) / "cuda_runtime_api.h").is_file() for d in dirs), dirs


@pytest.mark.slow
def test_the_prompts_cuda_form_passes_the_cpu_check(tmp_path):
    """The form the CUDA prompt asks for (a torch-free `.cu`; wrappers in `cpp_sources` that
    include `<c10/cuda/CUDAStream.h>`) is checked completely on a host without a GPU: the
    prompt's own example, and a candidate written that way."""
    from eval_helpers import candidate, cpu_config
    from kloop.evaluator.harness.pipeline import evaluate

    text = (Path(__file__).parents[2] / "prompts" / "_example_cuda.j2").read_text()
    s = strings(text.split("```python\n", 1)[1].split("```", 1)[0])
    log = nvcc_check(s["add_cuda_source"], s["add_cpp_source"], None, tmp_path / "example",
                     functions=["add"], cache_dir=tmp_path / "check-cache")
    assert log.ok and log.infra_error is None, log.log_tail
    r = evaluate("L3/1", candidate("mlp_cuda_relu_lean.py"), cpu_config(tmp_path / "cache"))
    assert (r.status, r.stage_reached) == ("not_run", "compile"), r.compile
    assert r.compile is not None and r.compile.ok and r.compile.infra_error is None
