"""FLOPs and bytes moved per forward of each bundled problem, counted once and kept as data
(`problems/level3_cost.json`), for the speed-of-light bound of reports (`agent.report.bound`).

`python -m problems.cost --write` counts every problem again (`problems.counting` says how);
`python -m problems.cost --check` exits 1 when an entry is missing or stale (its problem file
changed since it was counted). Reading the counts needs no torch.
"""

from __future__ import annotations

import argparse
import logging
import sys
from functools import cache
from pathlib import Path
from typing import Literal

from kloop.problems.registry import BUNDLED_DIR, Problem, load_problem_set
from pydantic import BaseModel, ConfigDict, Field

log = logging.getLogger(__name__)

COST_FILE = BUNDLED_DIR / "level3_cost.json"
COST_SCHEMA_VERSION = 1
ITEMSIZE = {"fp32": 4, "fp16": 2, "bf16": 2}
"""Bytes per floating-point element at each evaluation precision (`EvalConfig.precision`)."""


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid")


class ProblemCost(_Record):
    """The work of one forward of one problem at full size."""

    sha256: str
    """`Problem.sha256` of the file counted: an entry for another version does not apply."""
    flops: int
    """Matmul and convolution FLOPs (2 per multiply-add); other ops are not counted."""
    bytes: int
    """Inputs, touched parameters and buffers read once, outputs written once, at fp32."""
    float_bytes: int
    """The floating-point part of `bytes`: what a half-precision run halves."""
    method: Literal["meta", "meta_cpu_init"]
    """`meta`: built and run on the meta device; `meta_cpu_init`: built on CPU (its constructor
    reads values) and then moved to meta for the forward."""
    flops_by_op: dict[str, int] = Field(default_factory=dict)
    note: str | None = None

    def bytes_at(self, precision: str) -> int:
        """Bytes moved when floating tensors are held at `precision` (fp32, fp16, bf16)."""
        return self.bytes - self.float_bytes + self.float_bytes * ITEMSIZE[precision] // 4


class CostTable(_Record):
    schema_version: int = COST_SCHEMA_VERSION
    torch: str
    """The torch version that counted (the counter's rules may change between versions)."""
    counted: str
    problems: dict[str, ProblemCost]
    """By problem file stem, as in level3_meta.json."""


def load_costs(path: Path = COST_FILE) -> dict[str, ProblemCost]:
    """The committed counts by problem stem ({} where there is no file)."""
    if not path.exists():
        return {}
    return CostTable.model_validate_json(path.read_text()).problems


@cache
def _committed() -> dict[str, ProblemCost]:
    return load_costs()


def cost_of(problem: Problem) -> ProblemCost | None:
    """The committed count for this exact problem file, or None (a problem never counted, or a
    file that changed since: its hash is part of the entry). A KernelBench checkout's copy of a
    bundled file with the same normalised hash gets the same count."""
    cost = _committed().get(problem.stem)
    return cost if cost is not None and cost.sha256 == problem.sha256 else None


def stale(problems: list[Problem], costs: dict[str, ProblemCost]) -> list[str]:
    """Stems of the problems without an entry for their current file."""
    return [p.stem for p in problems if p.stem not in costs or costs[p.stem].sha256 != p.sha256]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m problems.cost", description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help=f"count every problem and write {COST_FILE.name}")
    ap.add_argument("--check", action="store_true", help="exit 1 if an entry is missing or stale")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    problems = load_problem_set().filter(level=3)
    if args.write:
        from kloop.problems.counting import count_all

        table = count_all(problems)
        COST_FILE.write_text(table.model_dump_json(indent=1) + "\n")
        log.info("wrote %s (%d problems)", COST_FILE, len(table.problems))
        return 0
    missing = stale(problems, load_costs())
    for stem in missing:
        log.info("missing or stale: %s", stem)
    if not missing:
        log.info("%s covers all %d problems", COST_FILE.name, len(problems))
    return 1 if missing and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
