"""A problem's turns as one search tree: every turn is a node whose parent is the turn it continues.

Built from the turn records alone (`TurnRecord.parent`), so the same tree comes out of a live
run, a resumed one and a run directory read later: the `tree` strategy picks the node to expand
from it (and, resumed, makes the same picks again over the records on disk), `kloop show --tree`
and the report draw it, and `--fork-at EPISODE:TURN` follows any node back to the root.

The root stands for the problem itself (no trajectory); its children are the first turns of
episodes started from scratch, and of episodes whose parent lies outside the turns given (a fork
continuing another run).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kloop.agent.records import NodeAddress, TurnRecord, TurnRef
from kloop.agent.tally import STATUS_RANK, best_turn, host_speedup, speedup_interval
from kloop.evaluator.common.result import SpeedupInterval
from pydantic import BaseModel, ConfigDict


def node_value(rec: TurnRecord) -> float:
    """How promising a node is, in [0, 1): a correct kernel 0.5 + s/(1+s)/2 for its speedup s vs
    eager (0.75 at 1x), where s is the low end of the speedup's interval over the paired rounds
    (a pessimistic value: a kernel whose speedup is mostly noise is not chased), else the point
    speedup (on CPU the ratio of host-clock times, `agent.tally.host_speedup`; 1x assumed where
    none was measured); a failed one by how far it got, from 0.3 (wrong output) down to 0 (no
    code), in steps of 0.05 (`agent.tally.STATUS_RANK`)."""
    ev = rec.eval
    if ev is not None and ev.correct:
        ci = speedup_interval(ev)
        s = ci.low if ci is not None else ev.speedup_vs_eager
        s = s if s is not None else host_speedup(ev)
        s = 1.0 if s is None else s
        return 0.5 + 0.5 * s / (1.0 + s)
    worst = max(STATUS_RANK.values())
    return 0.05 * max(0, worst - STATUS_RANK.get(rec.status, worst))


@dataclass(eq=False)
class Node:
    rec: TurnRecord
    parent: Node | None
    """None: a child of the root."""
    children: list[Node] = field(default_factory=list)
    size: int = 1
    """Nodes in this subtree, itself included: its visits, as UCT counts them."""
    pending: int = 0
    """Visits by the picks of the selection under way (`Tree.select`)."""
    pending_children: int = 0

    @property
    def address(self) -> NodeAddress:
        return NodeAddress(episode=self.rec.episode, turn=self.rec.turn)

    @property
    def expandable(self) -> bool:
        return self.rec.code is not None


class TreeRow(BaseModel):
    """One line of a drawn tree (what `kloop show --tree` prints and the report tabulates)."""

    model_config = ConfigDict(extra="forbid")

    prefix: str
    """Box-drawing characters placing the node under its parent."""
    node: str
    """`EPISODE:TURN`, the address `--fork-at` takes."""
    status: str
    speedup_vs_eager: float | None
    speedup_ci: SpeedupInterval | None = None
    """The interval of `speedup_vs_eager` over the paired rounds; None without one."""
    comparable: bool = True
    """False: `speedup_vs_eager` is a ratio of CPU times (`agent.tally.host_speedup`)."""
    value: float
    children: int
    best: bool
    origin: str | None = None
    """For a root of a fork's tree: the node of the source run it continues."""


class Tree:
    """The nodes of a problem's turns, linked through `TurnRecord.parent`."""

    def __init__(self, turns: list[TurnRecord], episode_parents: dict[str, TurnRef | None] | None = None,
                 external: dict[tuple[str, int], str] | None = None):
        """`episode_parents` (episode key -> `EpisodeRecord.parent`) places the first turns of
        records written before turns carried their parent. `external`: the labels of nodes
        outside these turns that some of them continue (the source run of a fork), by
        (episode key, turn)."""
        self.origin: dict[int, str] = {}
        """id(node) -> the label of the outside node a top node continues."""
        ordered = sorted(turns, key=lambda t: (t.episode, t.turn))
        self.nodes = {(t.episode_key, t.turn): Node(t, None) for t in ordered}
        self.top: list[Node] = []
        for node in self.nodes.values():
            ref = parent_ref(node.rec, episode_parents or {})
            node.parent = self.nodes.get((ref.episode_key, ref.turn)) if ref is not None else None
            if node.parent is None and ref is not None and (ref.episode_key, ref.turn) in (external or {}):
                self.origin[id(node)] = (external or {})[ref.episode_key, ref.turn]
            (node.parent.children if node.parent is not None else self.top).append(node)
        for node in reversed(self.nodes.values()):  # children come after their parents
            if node.parent is not None:
                node.parent.size += node.size
        self._root_pending = 0

    @property
    def visits(self) -> int:
        """The root's visits: every node, and the root itself."""
        return len(self.nodes) + 1

    def find(self, address: NodeAddress) -> Node | None:
        return next((n for n in self.nodes.values() if n.address == address), None)

    def path(self, node: Node | None) -> list[TurnRecord]:
        """The trajectory ending at `node`: its ancestors, root side first, then itself."""
        out = []
        while node is not None:
            out.append(node.rec)
            node = node.parent
        return out[::-1]

    def path_to(self, ref: TurnRef | None) -> list[TurnRecord]:
        return self.path(self.nodes.get((ref.episode_key, ref.turn))) if ref is not None else []

    def score(self, node: Node, exploration: float) -> float:
        """UCT: value + c * sqrt(ln n(parent) / n(node)), n counting the visits of the selection
        under way too. n(parent) > n(node) >= 1, so the bonus is finite and shrinks as a node's
        subtree grows: expanding one node again and again costs it its bonus."""
        n = node.size + node.pending
        parent = node.parent.size + node.parent.pending if node.parent else self.visits + self._root_pending
        return node_value(node.rec) + exploration * math.sqrt(math.log(parent) / n)

    def select(self, exploration: float, max_children: int, k: int = 1) -> list[Node | None]:
        """The `k` nodes to expand next, by score (the earliest node among equals); None: start
        from scratch, when no node has a kernel and room for a child. Each pick counts as a
        visit of the node and its ancestors before the next, so the picks of one step spread."""
        for node in self.nodes.values():
            node.pending = node.pending_children = 0
        self._root_pending = 0
        picks: list[Node | None] = []
        for _ in range(k):
            open_ = [n for n in self.nodes.values()
                     if n.expandable and len(n.children) + n.pending_children < max_children]
            pick = max(open_, key=lambda n: self.score(n, exploration), default=None)
            picks.append(pick)
            if pick is not None:
                pick.pending_children += 1
            node = pick
            while node is not None:
                node.pending += 1
                node = node.parent
            self._root_pending += 1
        return picks

    def rows(self) -> list[TreeRow]:
        """The tree drawn depth first, children in the order they were made."""
        best = best_turn(n.rec for n in self.nodes.values())
        out: list[TreeRow] = []

        def walk(node: Node, lead: str, last: bool) -> None:
            ev = node.rec.eval
            host = host_speedup(ev)
            speed = ev.speedup_vs_eager if ev is not None and host is None else host
            out.append(TreeRow(
                prefix=lead + ("└─ " if last else "├─ "), node=str(node.address),
                status=node.rec.status, speedup_vs_eager=speed, speedup_ci=speedup_interval(ev),
                comparable=host is None,
                value=round(node_value(node.rec), 4), children=len(node.children),
                best=node.rec is best, origin=self.origin.get(id(node))))
            for i, child in enumerate(node.children):
                walk(child, lead + ("   " if last else "│  "), i == len(node.children) - 1)

        for i, node in enumerate(self.top):
            walk(node, "", i == len(self.top) - 1)
        return out


def parent_ref(rec: TurnRecord, episode_parents: dict[str, TurnRef | None]) -> TurnRef | None:
    """The turn `rec` continues (records without `parent`: their episode's previous turn, or
    for a first turn the episode's own parent)."""
    if rec.parent is not None:
        return rec.parent
    if rec.turn > 1:
        return TurnRef(episode_key=rec.episode_key, turn=rec.turn - 1)
    return episode_parents.get(rec.episode_key)


def draw(rows: list[TreeRow], title: str) -> list[str]:
    """The tree as lines of text, under a `title` line for the root."""
    lines = [title]
    for r in rows:
        speed = f" {r.speedup_vs_eager:.3g}x" if r.speedup_vs_eager is not None else ""
        speed += f" [{r.speedup_ci.low:.3g}, {r.speedup_ci.high:.3g}]" if speed and r.speedup_ci else ""
        speed += " (CPU time, not comparable)" if speed and not r.comparable else ""
        mark = "  <- best" if r.best else ""
        # A fork keeps its source's episode numbers: say which source node a root continues,
        # so it is not taken for that node itself.
        origin = f" forked from source {r.origin}" if r.origin else ""
        lines.append(f"{r.prefix}{r.node}{origin} {r.status}{speed} (value {r.value:.2f}){mark}")
    return lines
