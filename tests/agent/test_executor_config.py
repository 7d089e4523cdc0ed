"""The executor's config and placement plan, without a Ray cluster (test_ray_executor.py runs
one)."""

from __future__ import annotations

import pytest
from kloop.agent.config import ConfigError, resolve
from kloop.agent.executor.placement import describe, plan

BASE = {"problems": ["L3/1"], "model": {"spec": "scripted:x.yaml"}}


def node(node_id: str, alive: bool = True, head: bool = False, **resources: float) -> dict:
    res = dict(resources)
    if head:
        res["node:__internal_head__"] = 1.0
    return {"NodeID": node_id, "Alive": alive, "NodeManagerAddress": f"10.0.0.{len(node_id)}",
            "Resources": res}


@pytest.mark.parametrize("address", ["auto", "10.1.2.3:6379", "ray://head.example:10001",
                                     "head-node_1.cluster.local:6380"])
def test_ray_addresses_that_are_accepted(address):
    cfg = resolve([BASE, {"executor": {"kind": "ray", "address": address}}])
    assert cfg.executor.address == address and cfg.executor.kind == "ray"


@pytest.mark.parametrize("address, message", [
    ("localhost", "not a Ray address"), ("http://h:1", "not a Ray address"),
    ("h:port", "not a Ray address")])
def test_ray_addresses_that_are_refused_say_why(address, message):
    with pytest.raises(ConfigError, match=message):
        resolve([BASE, {"executor": {"kind": "ray", "address": address}}])


def test_an_address_without_the_ray_executor_is_refused():
    with pytest.raises(ConfigError, match="executor.*address is for the ray executor"):
        resolve([BASE, {"executor": {"address": "auto"}}])
    with pytest.raises(ConfigError, match="executor.kind"):
        resolve([BASE, {"executor": {"kind": "slurm"}}])


def test_the_executor_changes_no_episode_key():
    """Resume, rescore and comparisons across executors rely on the same episode keys."""
    local = resolve([BASE])
    remote = resolve([BASE, {"executor": {"kind": "ray", "address": "auto", "resource": "kslot",
                                          "worker_concurrency": 8}}])
    assert local.executor.kind == "local" and local.digest() == remote.digest()


def test_the_plan_puts_one_worker_per_resource_unit_on_live_nodes_head_first():
    nodes = [node("b", GPU=2.0, **{"accelerator_type:H200": 1.0}), node("a", head=True, GPU=1.0),
             node("c", alive=False, GPU=8.0), node("d", CPU=16.0), node("e", GPU=0.5)]
    slots = plan(nodes, "GPU")
    assert [(s.node_id, s.workers, s.head, s.accelerator) for s in slots] == [
        ("a", 1, True, None), ("b", 2, False, "H200")]
    lines = describe(slots, "GPU", 4, 4)
    assert "3 worker(s) on 2 node(s), up to 4 evaluation(s) in flight each" in lines[-2]
    assert "concurrency 4 keeps at most 4 of 12 evaluation slots busy" in lines[-1]
    assert "H200" in lines[1]


def test_a_plan_with_no_node_offering_the_resource_says_so():
    slots = plan([node("a", head=True, GPU=1.0)], "kslot")
    assert slots == []
    assert "no live node offers the resource 'kslot'" in describe(slots, "kslot", 4, 4)[-1]
