"""The ray executor on a multi-node Ray cluster started on this machine (CPU only).

One cluster for the module: a head and two more nodes, each offering one unit of a stand-in
resource (`kslot`) where a GPU cluster offers GPUs, so each node gets one evaluation worker that
judges in CPU mode with kloop's real evaluator. The runs are the bundled best-of-4 example's
scripted replies (agent/demo/suite/best_of_n.yaml) at the examples' small sizes: a mix of
compile errors, crashes, wrong and correct kernels. The node-killing test runs last: it leaves
the cluster a node short.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from kloop.agent.config import resolve
from kloop.agent.demo.kernels import SIZES, source
from kloop.agent.executor import ray_pool
from kloop.agent.run import start
from kloop.agent.store import RunStore

ray = pytest.importorskip("ray")
from ray.cluster_utils import Cluster  # noqa: E402

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
REPLIES = REPO / "agent" / "demo" / "suite" / "best_of_n.yaml"
PROBLEMS = ["L3/1", "L3/13"]
STORE_MB = 80 * 2**20


@pytest.fixture(scope="module")
def cluster():
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {"kslot": 1}, "include_dashboard": False,
        "object_store_memory": STORE_MB})
    nodes = [c.add_node(num_cpus=1, resources={"kslot": 1}, object_store_memory=STORE_MB)
             for _ in range(2)]
    c.wait_for_nodes()
    ray.init(address=c.address, log_to_driver=False)
    try:
        yield c, nodes
    finally:
        ray_pool.close_pools()
        ray.shutdown()
        c.shutdown()


def run_layer(tmp_path: Path, name: str, problems: list[str], **executor) -> dict:
    return {
        "problems": problems, "model": {"spec": f"scripted:{REPLIES}"},
        "problem_overrides": {p: SIZES[p] for p in problems},
        "strategy": {"kind": "best_of_n", "samples": 4}, "concurrency": 4,
        "eval": {"device": "cpu"}, "runs_dir": str(tmp_path), "run_id": name,
        "executor": executor or {"kind": "local"},
    }


def verdicts(root: Path) -> dict[tuple[str, int, int], str]:
    turns = RunStore.open(root).turns()
    keys = [(t.episode_key, t.turn) for t in turns]
    assert len(keys) == len(set(keys)), "a turn was recorded twice"
    return {(t.problem_id, t.episode, t.turn): t.status for t in turns}


def test_dry_run_prints_one_worker_per_stand_in_gpu_on_every_node(cluster, tmp_path):
    c, _ = cluster
    out = subprocess.run(
        [sys.executable, "-m", "kloop.agent.cli", "run", "-p", "L3/1", "--model", f"scripted:{REPLIES}",
         "--executor", "ray", "--ray-address", c.address, "-c", "executor.resource=kslot",
         "--concurrency", "2", "--dry-run", "--runs-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert f"ray executor on {c.address}" in out.stdout
    assert out.stdout.count("1 worker(s), one per kslot") == 3
    assert "3 worker(s) on 3 node(s), up to 4 evaluation(s) in flight each" in out.stdout
    assert "concurrency 2 keeps at most 2 of 12 evaluation slots busy" in out.stdout
    assert not list(tmp_path.iterdir()), "a dry run created a run directory"


def test_a_killed_driver_resumes_on_the_cluster_with_no_turn_lost_or_repeated(cluster, tmp_path):
    """`kloop run --resume` after `kill -9` of the driver: the workers the dead driver owned go
    with it, the resumed driver starts its own and continues after the turns on disk."""
    c, _ = cluster
    run_dir = tmp_path / "resumed"
    args = ["run", "-p", "L3/1", "--model", f"scripted:{REPLIES}", "-c",
            f"problem_overrides={json.dumps({'L3/1': SIZES['L3/1']})}", "--strategy", "best_of_n",
            "--samples", "4", "--concurrency", "1", "--device", "cpu", "--executor", "ray",
            "--ray-address", c.address, "-c", "executor.resource=kslot", "--out", str(run_dir)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "kloop.agent.cli", *args], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    turns = run_dir / "turns.jsonl"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        if turns.exists() and turns.read_bytes().count(b"\n") >= 2:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed: " + proc.communicate()[0]
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    done = RunStore.open(run_dir).turns()
    assert 2 <= len(done) < 4
    resumed = subprocess.run([sys.executable, "-m", "kloop.agent.cli", "run", "--resume", str(run_dir)],
                             cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    got = verdicts(run_dir)
    assert sorted(e for _, e, _ in got) == [0, 1, 2, 3]
    assert [t.reply.text for t in RunStore.open(run_dir).turns()[: len(done)]] == \
        [t.reply.text for t in done], "turns on disk before the kill were rewritten"
    # The example's plan for L3/1: wrong, syntax error, correct, crash.
    assert [got[("L3/1", e, 1)] for e in range(4)] == \
        ["incorrect", "compile_error", "correct", "runtime_error"]
    summary = RunStore.open(run_dir).summary()
    assert summary.status == "finished" and summary.executor is not None
    assert summary.executor.address == c.address

    # Rescored on the cluster (as an imported KernelBench folder would be): the same verdicts.
    from kloop.agent.replay import rescore

    report = rescore(run_dir, tmp_path / "rescored", executor={
        "kind": "ray", "address": c.address, "resource": "kslot"})
    assert report.differences == [] and report.turns_compared == 4
    assert RunStore.open(tmp_path / "rescored").summary().executor is not None


def test_a_worker_that_keeps_dying_drains_its_node_and_the_candidate_goes_elsewhere(cluster,
                                                                                   tmp_path):
    """A worker killed under an evaluation (its node alive): the candidate is judged again on
    another node, and with `drain_after: 1` that node gets no more work. An exception of the
    evaluator itself (a device the worker lacks) is the evaluator's fault, as it is locally."""
    from kloop.agent.components import load_problems
    from kloop.agent.errors import EvalInfraError
    from kloop.agent.executor.ray_pool import RayEvaluator
    from kloop.evaluator.common.config import EvalConfig

    c, _ = cluster
    cfg = resolve([run_layer(tmp_path, "drain", ["L3/1"], kind="ray", address=c.address,
                             resource="kslot", worker_concurrency=1, drain_after=1)])
    problem = load_problems(cfg)[0]
    ev = RayEvaluator(cfg, [problem])
    try:
        outcome: dict = {}
        judge = threading.Thread(
            target=lambda: outcome.update(r=ev.evaluate(problem, source("L3/1", "ok"))))
        judge.start()
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not ev.pool.in_flight():
            time.sleep(0.01)
        (node_id,) = ev.pool.in_flight()
        (busy,) = [w for w in ev.pool.workers if w.node_id == node_id and w.alive]
        ray.kill(busy.handle)
        judge.join(timeout=120)
        assert outcome["r"].status == "correct"
        for _ in range(2):
            assert ev.evaluate(problem, source("L3/1", "wrong")).status == "incorrect"
        report = {n.node_id: n for n in ev.report().nodes}
        assert report[node_id].state == "drained" and report[node_id].lost == 1
        assert report[node_id].evaluations == 0 and ev.report().requeued == 1
        assert sum(n.evaluations for n in report.values()) == 3
        with pytest.raises(EvalInfraError, match="cuda:3"):
            ev.pool.evaluate(problem, source("L3/1", "ok"),
                             EvalConfig(device="cuda:3").model_dump_json())
    finally:
        ev.pool.close()


def test_a_node_killed_mid_run_loses_no_turn_and_changes_no_verdict(cluster, tmp_path):
    """Two problems, four samples each, judged locally and then on the cluster while one node
    is removed with an evaluation in flight on it: the same verdicts, each turn recorded once,
    the lost evaluation re-queued as an infrastructure fault and the node reported lost."""
    c, nodes = cluster
    victim = nodes[-1]
    local, _ = start(resolve([run_layer(tmp_path, "local", PROBLEMS)]))
    cfg = resolve([run_layer(tmp_path, "ray", PROBLEMS, kind="ray", address=c.address,
                             resource="kslot", worker_concurrency=2)])
    outcome: dict = {}
    runner = threading.Thread(target=lambda: outcome.update(summary=start(cfg)[0]), daemon=True)
    runner.start()
    deadline, killed = time.monotonic() + 240, False
    while time.monotonic() < deadline and runner.is_alive():
        pool = next(iter(ray_pool._pools.values()), None)
        if pool is not None and pool.in_flight().get(victim.node_id):
            c.remove_node(victim)
            killed = True
            break
        time.sleep(0.02)
    assert killed, "no evaluation ever ran on the node to kill"
    runner.join(timeout=600)
    assert not runner.is_alive() and "summary" in outcome
    summary = outcome["summary"]
    assert summary.status == "finished"
    assert verdicts(tmp_path / "ray") == verdicts(tmp_path / "local")
    assert len(verdicts(tmp_path / "ray")) == len(PROBLEMS) * 4
    ex = summary.executor
    assert ex is not None and ex.requeued >= 1
    lost = [n for n in ex.nodes if n.state == "lost"]
    assert [n.node_id for n in lost] == [victim.node_id] and lost[0].lost >= 1
    assert sum(n.evaluations for n in ex.nodes) == len(PROBLEMS) * 4
    assert all(n.hardware == "cpu" for n in ex.nodes)
    ep_stops = {e.stop_reason for e in RunStore.open(tmp_path / "ray").episodes()}
    assert "infra_error" not in ep_stops
    assert local.status == "finished"
