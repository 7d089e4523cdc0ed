"""Which Ray nodes get evaluation workers, and how many: one per unit of `executor.resource`
(one per GPU by default) on every live node. Pure functions of `ray.nodes()`, so the plan
(`kloop run --executor ray --dry-run`) is the same code the pool starts workers from."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

_ACCELERATOR = "accelerator_type:"


class NodeSlots(BaseModel):
    """A node and the workers it gets."""

    model_config = ConfigDict(frozen=True)

    node_id: str
    address: str
    workers: int
    accelerator: str | None = None
    """Ray's own label of the node's GPUs (`accelerator_type:H200`), when it set one."""
    head: bool = False


def plan(nodes: list[dict[str, Any]], resource: str) -> list[NodeSlots]:
    """Live nodes offering `resource`, each with one worker per whole unit, head first."""
    slots = []
    for n in nodes:
        res = n.get("Resources", {})
        count = int(res.get(resource, 0))
        if not n.get("Alive") or count < 1:
            continue
        label = next((k.removeprefix(_ACCELERATOR) for k in res if k.startswith(_ACCELERATOR)), None)
        slots.append(NodeSlots(node_id=n["NodeID"], address=n.get("NodeManagerAddress", "?"),
                               workers=count, accelerator=label,
                               head="node:__internal_head__" in res))
    return sorted(slots, key=lambda s: (not s.head, s.address, s.node_id))


def describe(slots: list[NodeSlots], resource: str, per_worker: int, concurrency: int) -> list[str]:
    """The placement in words, one line per node, then the totals and any advice."""
    lines = [f"node {s.node_id[:12]} at {s.address}{' (head)' if s.head else ''}: "
             f"{s.workers} worker(s), one per {resource}"
             f"{f', {s.accelerator}' if s.accelerator else ''}" for s in slots]
    workers = sum(s.workers for s in slots)
    lines.append(f"{workers} worker(s) on {len(slots)} node(s), up to {per_worker} evaluation(s) "
                 f"in flight each; the driver runs {concurrency} episode(s) at once")
    if not slots:
        lines.append(f"no live node offers the resource {resource!r}: nothing would be evaluated")
    elif concurrency < workers * per_worker:
        lines.append(f"note: concurrency {concurrency} keeps at most {concurrency} of "
                     f"{workers * per_worker} evaluation slots busy (raise --concurrency)")
    return lines
