"""Checks that need no GPU run before anything that does (evaluator/harness/precheck.py)."""

from __future__ import annotations

import json
import time

import pytest
from agent_fakes import run_kloop
from kloop.evaluator.harness.precheck import (
    UnknownConstant,
    check_overrides,
    module_constants,
    precheck_source,
    small_overrides,
)
from kloop.problems.registry import get_problem, load_problem_set


@pytest.mark.parametrize(("source", "kind"), [
    ("caf\xe9".encode("latin-1"), "not_utf8"),
    ("", "empty"),
    ("  \n# only a comment\n", None),  # not empty text, but no ModelNew either: see below
    ("def f(:\n", "syntax"),
    ("import torch\nclass Model(torch.nn.Module):\n    pass\n", "no_model_new"),
    ("def make():\n    class ModelNew: pass\n", "no_model_new"),  # must be top level
    ("class ModelNew:\n    pass\n", None),
    (b"class ModelNew:\n    pass\n", None),
])
def test_precheck_source(source, kind):
    bad = precheck_source(source)
    if source == "  \n# only a comment\n":
        assert bad is not None and bad.kind == "no_model_new"
        return
    assert (bad.kind if bad else None) == kind


def test_overrides_must_name_module_constants():
    mlp = get_problem("L3/1")
    assert {"batch_size", "input_size", "layer_sizes", "output_size"} <= module_constants(mlp.source)
    check_overrides(mlp.source, {"batch_size": 2}, "L3/1")
    with pytest.raises(UnknownConstant, match="'foo'"):
        check_overrides(mlp.source, {"foo": 2, "batch_size": 2}, "L3/1")


def test_small_size_shrinks_the_mlp_consistently():
    assert small_overrides(get_problem("L3/1").source) == {
        "batch_size": 2, "input_size": 512, "layer_sizes": [512, 512], "output_size": 256}


def test_small_size_keeps_divisibility_and_names_only_constants():
    for p in load_problem_set(None).filter(3):
        small = small_overrides(p.source)
        check_overrides(p.source, small, p.id)
        namespace: dict = {}
        for name in module_constants(p.source):
            line = next((ln for ln in p.source.splitlines() if ln.startswith(f"{name} = ")), None)
            if line is not None:
                try:
                    namespace[name] = eval(line.partition("=")[2])  # literals only, from our own files
                except Exception:
                    continue
        kept = {v for k, v in namespace.items() if isinstance(v, int) and k not in small and v > 1}
        for name, value in small.items():
            old = namespace[name]
            for new, before in zip(value if isinstance(value, list) else [value],
                                   old if isinstance(old, list | tuple) else [old], strict=True):
                assert new <= before, (p.id, name)
                for d in kept:
                    if before % d == 0 and "batch" not in name:
                        assert new % d == 0, (p.id, name, d)


def test_an_empty_candidate_is_judged_before_the_reference_runs(tmp_path):
    empty = tmp_path / "empty.py"
    empty.write_text("")
    start = time.monotonic()
    res = run_kloop("eval", empty, "-p", "L3/1", "--device", "cpu", "--json")
    assert time.monotonic() - start < 30  # the reference alone used to take 40-50 s here
    result = json.loads(res.stdout)
    assert res.exit_code == 1
    assert (result["status"], result["stage_reached"]) == ("compile_error", "static")
    assert set(result["stage_seconds"]) == {"static"}
    assert res.stderr == ""  # piped: no progress line, nothing but the one JSON object on stdout


def test_no_model_new_is_a_verdict_with_its_reason(tmp_path):
    path = tmp_path / "model_only.py"
    path.write_text("import torch\nclass Model(torch.nn.Module):\n    pass\n")
    res = run_kloop("eval", path, "-p", "L3/1", "--device", "cpu")
    assert res.exit_code == 1
    assert "compile_error" in res.stdout and "ModelNew" in res.stdout
