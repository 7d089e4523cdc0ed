"""Every GPU on the host (`evaluator.procs.devicepool`): evaluations spread over the visible GPUs, each
keeps its GPU to the end, and a GPU asked for by index is the only one used."""

from __future__ import annotations

import threading

import pytest
from eval_helpers import candidate, cpu_config

from kloop.evaluator.harness.pipeline import evaluate
from kloop.evaluator.harness.state import EvalRun
from kloop.evaluator.procs import devicepool
from kloop.problems.registry import get_problem


def busy(prefix: str = "cuda") -> dict[str, int]:
    """In flight on `prefix` devices (other tests' evaluations in this process are not ours)."""
    return {d: n for d, n in devicepool.in_flight().items() if d.startswith(prefix)}


@pytest.fixture
def gpus(monkeypatch):
    """A host with `n` visible GPUs, as `torch.cuda.device_count` would say."""
    def make(n: int) -> None:
        monkeypatch.setattr(devicepool, "gpu_count", lambda: n)
    return make


def test_auto_and_cuda_span_every_visible_gpu_and_an_index_only_itself(gpus):
    gpus(4)
    assert devicepool.pool("auto") == devicepool.pool("cuda") == [f"cuda:{i}" for i in range(4)]
    assert devicepool.pool("cuda:2") == ["cuda:2"]
    assert devicepool.pool("cpu") == ["cpu"]
    with pytest.raises(RuntimeError, match="4 CUDA device"):
        devicepool.pool("cuda:4")
    gpus(0)
    assert devicepool.pool("auto") == ["cpu"]
    with pytest.raises(RuntimeError, match="no CUDA device"):
        devicepool.pool("cuda")


def test_claims_go_to_the_least_busy_gpu_and_come_back(gpus):
    gpus(3)
    first = [devicepool.claim("auto") for _ in range(3)]
    assert [c.device for c in first] == ["cuda:0", "cuda:1", "cuda:2"]
    fourth = devicepool.claim("auto")
    assert fourth.device == "cuda:0"  # all equally busy: the lowest index
    first[1].release()
    first[1].release()  # twice is once
    again = devicepool.claim("auto")
    assert again.device == "cuda:1"
    assert busy() == {"cuda:0": 2, "cuda:1": 1, "cuda:2": 1}
    for c in [*first, fourth, again]:
        c.release()
    assert busy() == {}
    c = devicepool.claim("cuda:1")
    assert busy() == {"cuda:1": 1}
    c.release()


def test_concurrent_claims_are_balanced(gpus):
    gpus(4)
    got: list[devicepool.Claim] = []
    lock = threading.Lock()

    def take():
        c = devicepool.claim("cuda")
        with lock:
            got.append(c)

    threads = [threading.Thread(target=take) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert busy() == {f"cuda:{i}": 4 for i in range(4)}
    for c in got:
        c.release()
    assert busy() == {}


def test_an_evaluation_holds_its_device_until_cleanup(tmp_path):
    before = busy("cpu").get("cpu", 0)
    run = EvalRun.create(get_problem("L3/1"), "", cpu_config(tmp_path / "cache"))
    assert busy("cpu") == {"cpu": before + 1}
    run.cleanup()
    assert busy("cpu").get("cpu", 0) == before
    r = evaluate("L3/1", candidate("mlp_torch.py"), cpu_config(tmp_path / "cache"))
    assert r.status == "correct" and r.device == "cpu"
    assert busy("cpu").get("cpu", 0) == before


@pytest.mark.gpu
def test_every_visible_gpu_is_in_the_pool_and_results_name_theirs(tmp_path):
    import torch

    assert devicepool.pool("auto") == [f"cuda:{i}" for i in range(torch.cuda.device_count())]
    r = evaluate("L3/1", candidate("mlp_torch.py"),
                 cpu_config(tmp_path / "cache", device="auto"))
    assert r.status == "correct" and r.device in devicepool.pool("auto"), r.error
