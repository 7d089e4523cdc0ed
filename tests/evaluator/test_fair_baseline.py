"""The eager baseline measured as a candidate (`eager_baseline_from: candidate`): the reference's
own code goes through the whole candidate path, once per problem and config, and every later
candidate's speedup is taken against that."""

from __future__ import annotations

import pytest
from eval_helpers import candidate, cpu_config

from kloop.evaluator.harness.checks import ast_rules
from kloop.evaluator.harness.fair_baseline import honest_source
from kloop.evaluator.harness.pipeline import evaluate
from kloop.evaluator.harness.precheck import precheck_source
from kloop.evaluator.harness.reference import BaselineRecord
from kloop.evaluator.procs.isolation import private_dir
from kloop.problems.registry import load_problem_set

PROBLEMS = [p for p in load_problem_set().problems if p.id.startswith("L3/")]


@pytest.mark.parametrize("problem", PROBLEMS, ids=[p.id for p in PROBLEMS])
def test_every_reference_as_a_candidate_passes_the_static_stage(problem):
    src = honest_source(problem.path.read_text())
    assert precheck_source(src) is None
    assert [v for v in ast_rules(src, "torch", "strict") if v.severity == "reject"] == []
    assert "class ModelNew(" in src and "class Model(" not in src


def test_the_eager_baseline_is_measured_once_as_a_candidate_then_read(tmp_path):
    cfg = cpu_config(tmp_path / "cache", baselines="eager", eager_baseline_from="candidate")
    first = evaluate("L3/1", candidate("mlp_torch.py"), cfg)
    assert first.status == "correct", first.error
    assert first.eager is not None and first.eager.clock == "harness"
    assert first.eager.measured_as == "candidate"
    (path,) = [p for p in (private_dir(tmp_path / "cache") / "baselines").glob("*.json")
               if BaselineRecord.model_validate_json(p.read_text()).key_fields.get("measured_as")
               == "candidate"]
    record = BaselineRecord.model_validate_json(path.read_text())
    assert record.eager.median_ms == first.eager.median_ms
    assert record.key_fields["policy"] == "strict"
    stamp = path.stat().st_mtime_ns
    second = evaluate("L3/1", candidate("mlp_triton.py"), cfg)
    assert second.status == "correct", second.error
    assert second.eager == first.eager and path.stat().st_mtime_ns == stamp  # read, not re-run
    assert second.stage_seconds["eager_as_candidate"] < first.stage_seconds["eager_as_candidate"]


def test_the_reference_workers_baseline_stays_the_default(tmp_path):
    r = evaluate("L3/1", candidate("mlp_torch.py"), cpu_config(tmp_path / "cache", baselines="eager"))
    assert r.status == "correct" and r.eager is not None
    assert r.eager.measured_as == "reference" and r.timing.measured_as is None
    assert "eager_as_candidate" not in r.stage_seconds
