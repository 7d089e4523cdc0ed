"""The ray executor's worker on a GPU, without Ray: the class each actor runs, judging a
candidate on the H200 from a problem sent by content (Ray itself does not fit in a device call:
its wheel is larger than what one carries). What Ray adds around it is tested on CPU
(test_ray_executor.py)."""

from __future__ import annotations

from pathlib import Path

import pytest
from kloop.agent.executor.ray_worker import EvalWorker, WorkerInfo
from kloop.evaluator.common.config import EvalConfig
from kloop.problems.registry import get_problem

CANDIDATES = Path(__file__).resolve().parents[1] / "evaluator" / "candidates"


@pytest.mark.gpu
def test_the_worker_judges_a_problem_sent_by_content_on_its_gpu(tmp_path):
    import torch

    worker = EvalWorker("cuda")
    info = WorkerInfo.model_validate_json(worker.hello())
    assert info.hardware == torch.cuda.get_device_name(0) and info.hardware != "cpu"
    # The problem as the driver sends it, pointing at a path this node does not have.
    problem = get_problem("L3/1").model_copy(update={"path": tmp_path / "elsewhere" / "1_MLP.py"})
    config = EvalConfig(device="cuda", cache_dir=tmp_path / "cache",
                        problem_overrides={"batch_size": 64})
    out = worker.evaluate(problem, (CANDIDATES / "mlp_triton.py").read_text(),
                          config.model_dump_json())
    from kloop.evaluator.common.result import EvalResult

    result = EvalResult.model_validate_json(out)
    assert result.status == "correct", result.error
    assert result.env is not None and result.env.device_name == info.hardware
    assert result.timing is not None and result.timing.comparable
    assert result.problem_sha256 == problem.sha256
