"""The pipeline board (`evaluator.procs.board`): evaluations in flight show where they are, and the run
progress line (`agent.run.PipelineColumn`) reads it."""

from __future__ import annotations

import threading
import time

from eval_helpers import candidate, cpu_config, light_cuda_candidate

from kloop.evaluator.harness.pipeline import evaluate_many
from kloop.evaluator.procs import board


def test_evaluations_pass_through_build_and_device_and_leave_nothing_behind(cache_dir):
    seen: set[str] = set()
    done = threading.Event()

    def watch():
        while not done.is_set():
            seen.update(board.snapshot())
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        results = evaluate_many([("L3/1", light_cuda_candidate()),
                                 ("L3/1", candidate("mlp_torch.py"))],
                                cpu_config(cache_dir, build_slots=1), max_workers=2)
    finally:
        done.set()
        watcher.join()
    assert results[1].status == "correct", results[1].error
    assert {"build", "device"} <= seen, seen
    assert results[0].stage_seconds["build_wait"] >= 0 and "compile" in results[0].stage_seconds
    # The CUDA candidate's check passes: `not_run` for want of a GPU, not a compile error.
    assert results[0].status == "not_run" and results[0].compile.ok, results[0].compile
    assert board.snapshot() == {}


def test_the_progress_line_names_the_phases():
    from rich.progress import Progress

    from kloop.agent.run import PipelineColumn

    progress = Progress()
    progress.add_task("turns")
    task = progress.tasks[0]
    with board.phase("build"), board.phase("build"), board.phase("device_wait"):
        assert PipelineColumn().render(task).plain == "building 2 · waiting for the device 1"
    assert PipelineColumn().render(task).plain == ""
