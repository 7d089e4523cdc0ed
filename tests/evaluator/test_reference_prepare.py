"""Work that needs no device is done before a child asks for it (off the device lock): the
reference worker's problem, models built on CPU and trials' inputs drawn and written; the
candidate child's reading of those inputs. What is computed must not change with that: the same
inputs, fills and expected outputs whether a trial was prepared before the lock or made under
it, and whatever the thread count."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
import torch

from kloop.evaluator.common.config import EvalConfig
from kloop.evaluator.common.protocol import ProblemSpec, ReferenceJob, RefTrial
from kloop.evaluator.harness.pipeline import evaluate
from kloop.evaluator.procs import isolation
from kloop.evaluator.worker import reference_worker
from kloop.evaluator.worker.construct import construct, draw_inputs, init_inputs, load_problem
from kloop.problems.registry import get_problem, load_problem_set, reference_as_candidate

SLOW_INIT = textwrap.dedent('''
    import time
    import torch
    import torch.nn as nn

    batch_size = 4
    width = 32
    INIT_SECONDS = 3.0


    class Model(nn.Module):
        def __init__(self, width):
            super().__init__()
            time.sleep(INIT_SECONDS)  # a constructor that takes a while, as big models' do
            self.fc = nn.Linear(width, width)
            self.norm = nn.LayerNorm(width)

        def forward(self, x):
            return self.norm(torch.relu(self.fc(x)))


    def get_inputs():
        return [torch.randn(batch_size, width)]


    def get_init_inputs():
        return [width]
''')


def test_the_reference_builds_its_model_before_it_holds_the_device(tmp_path: Path):
    folder = tmp_path / "problems"
    folder.mkdir()
    (folder / "1_SlowInit.py").write_text(SLOW_INIT)
    problem = load_problem_set(folder).problems[0]
    # The candidate builds the model too, sleeping the same 3 s per build: before its hold
    # where the harness can build ahead (`construct_at`), else under it.
    result = evaluate(problem, reference_as_candidate(SLOW_INIT), EvalConfig(
        device="cpu", cache_dir=tmp_path / "cache", baselines="none", profile=False))
    assert result.status == "correct", result.error
    s = result.stage_seconds
    # Strict builds the model twice (the main one and the reparam trial's): both before the
    # worker said it was ready, none while it held the device.
    assert s["reference_start"] >= 6.0, s
    assert s["reference_held"] < 3.0, s  # it was >= 6 s: both builds under the lock
    if isolation.can_grant():
        assert s["candidate_start"] >= 6.0 and s["candidate_held"] < 3.0, s
    else:
        assert s["candidate_held"] >= 3.0, s


def _job(tmp_path: Path, problem_id: str, overrides: dict, trials: int = 3) -> ReferenceJob:
    problem = get_problem(problem_id)
    spec = ProblemSpec(path=str(problem.path), sha256=problem.sha256, overrides=overrides,
                       device="cpu", precision="fp32", allow_tf32=False, construction_seed=1234)
    tmp_path.mkdir(parents=True, exist_ok=True)
    return ReferenceJob(
        problem=spec, baselines=[], timing=None, fills_path=str(tmp_path / "fills_main.pt"),
        trials=[RefTrial(index=k, kind="reparam" if k == trials - 1 else "random",
                         input_seed=100 + k, forward_seed=200 + k,
                         inputs_path=str(tmp_path / f"inputs_{k}.pt"),
                         expected_path=str(tmp_path / f"expected_{k}.pt"),
                         perturb_seed=300 if k == trials - 1 else None,
                         fills_path=str(tmp_path / f"fills_{k}.pt") if k == trials - 1 else None)
                for k in range(trials)])


class _Channel:
    def __init__(self) -> None:
        self.sent: list = []

    def send(self, msg) -> None:
        self.sent.append(msg)


def _run_trials(job: ReferenceJob) -> dict[str, list]:
    prepared = reference_worker._prepare(job)
    model = prepared.model
    assert model is not None
    for t in job.trials:
        reference_worker._trial(prepared.problem, model, prepared.init, job.problem, t,
                                _Channel(), prepared)
    files = [job.fills_path] + [p for t in job.trials
                                for p in (t.inputs_path, t.expected_path, t.fills_path) if p]
    return {Path(p).name: torch.load(p, weights_only=True) for p in files}


def _same(a: dict[str, list], b: dict[str, list]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert len(a[name]) == len(b[name]), name
        for x, y in zip(a[name], b[name], strict=True):
            assert torch.equal(x, y) if isinstance(x, torch.Tensor) else x == y, name


@pytest.mark.parametrize("problem_id, overrides", [
    ("L3/13", {"batch_size": 2, "num_input_features": 8, "num_output_features": 16,
               "height": 16, "width": 16}),  # BatchNorm: constant fills, a reparam model
    ("L3/1", {"batch_size": 4, "input_size": 48, "layer_sizes": [48, 48], "output_size": 16}),
])
def test_prepared_and_locked_trials_compute_the_same(tmp_path: Path, monkeypatch, problem_id,
                                                     overrides):
    prepared = _run_trials(_job(tmp_path / "prepared", problem_id, overrides))
    # Nothing fits: every trial's inputs and second model are made under the lock, as before.
    monkeypatch.setattr(reference_worker, "PREPARED_BYTES", 0)
    job = _job(tmp_path / "locked", problem_id, overrides)
    assert reference_worker._prepare(job).inputs == {}
    _same(prepared, _run_trials(job))


def test_the_byte_budget_keeps_the_first_trials_only(tmp_path: Path, monkeypatch):
    overrides = {"batch_size": 4, "input_size": 48, "layer_sizes": [48, 48], "output_size": 16}
    job = _job(tmp_path, "L3/1", overrides, trials=4)
    model_bytes = sum(p.numel() * 4 for p in reference_worker._prepare(job).model.parameters())
    monkeypatch.setattr(reference_worker, "PREPARED_BYTES", model_bytes + 2 * 4 * 48 * 4)
    prepared = reference_worker._prepare(job)
    assert sorted(prepared.inputs) == [0, 1]
    assert prepared.models == {}


def test_preparing_on_one_thread_draws_the_same_values():
    """`PREPARE_THREADS` is 1; the device path built with torch's default thread count. Sizes
    above PyTorch's parallel grain (32768 elements) so that threads would split the work."""
    problem = get_problem("L3/1")
    spec = ProblemSpec(path=str(problem.path), sha256=problem.sha256, device="cpu",
                       precision="fp32", allow_tf32=False,
                       overrides={"batch_size": 64, "input_size": 1024,
                                  "layer_sizes": [1024, 512], "output_size": 256})
    module = load_problem(spec)
    init = init_inputs(module, spec)
    threads = torch.get_num_threads()
    built = {}
    try:
        for n in (1, max(2, threads)):
            torch.set_num_threads(n)
            model = construct(module.Model, init, spec)
            built[n] = ([p.detach().clone() for p in model.parameters()],
                        draw_inputs(module, 7, spec))
    finally:
        torch.set_num_threads(threads)
    (p1, x1), (p2, x2) = built.values()
    assert all(torch.equal(a, b) for a, b in zip(p1, p2, strict=True))
    assert all(torch.equal(a, b) for a, b in zip(x1, x2, strict=True))


def test_the_candidate_reads_trial_inputs_before_the_lock_within_its_budget(tmp_path: Path,
                                                                             monkeypatch):
    from kloop.evaluator.common.protocol import CandTrial
    from kloop.evaluator.worker import trials as trials_mod

    made = {k: [torch.full((256,), float(k)), k] for k in range(4)}
    for k, inputs in made.items():
        torch.save(inputs, tmp_path / f"inputs_{k}.pt")
    trials = [CandTrial(index=k, kind="random", forward_seed=k,
                        inputs_path=str(tmp_path / f"inputs_{k}.pt"),
                        output_path=str(tmp_path / f"output_{k}.pt")) for k in range(4)]
    got = trials_mod.preload_inputs(trials)
    assert sorted(got) == [0, 1, 2, 3]
    assert all(torch.equal(got[k][0], made[k][0]) and got[k][1] == k for k in made)
    size = (tmp_path / "inputs_0.pt").stat().st_size
    monkeypatch.setattr(trials_mod, "PRELOADED_BYTES", 2 * size)
    assert sorted(trials_mod.preload_inputs(trials)) == [0, 1]  # the rest: under the lock
    (tmp_path / "inputs_1.pt").unlink()
    monkeypatch.setattr(trials_mod, "PRELOADED_BYTES", 4 << 30)
    assert sorted(trials_mod.preload_inputs(trials)) == [0]  # run_trial meets the missing file


@pytest.mark.parametrize("available_gib, budget_gib", [
    (110, 6.875),  # the H200 host at rest: L3/1's main and second model (2 x 2.7 GB) fit
    (512, 16),     # at most 16 GiB
    (20, 4),       # never less than it always was
])
def test_the_budget_is_a_share_of_the_memory_the_host_has_available(available_gib, budget_gib):
    from kloop.evaluator.worker.construct import prepare_budget

    meminfo = f"MemTotal: {2 * available_gib << 20} kB\nMemAvailable: {available_gib << 20} kB\n"
    assert prepare_budget(meminfo) == int(budget_gib * (1 << 30))
    assert prepare_budget("no such line\n") == 4 << 30  # unreadable: what it always was
