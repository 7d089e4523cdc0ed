"""Why the JIT prime's Triton cache keys differ from the candidate child's (GPU machine).

    python bench/diag_prime.py

Evaluates the test suite's Triton MLP with `jit_prime: auto`, keeps the work dir, and prints
every entry of the evaluation's Triton cache: which ones the prime wrote and which the
candidate child added, with each kernel's metadata (the JSON Triton writes beside a cubin),
then the metadata fields that differ between a primed entry and an added one of the same
kernel name: what the prime must match.
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "tests" / "evaluator")]

from eval_helpers import candidate, cpu_config  # noqa: E402

from kloop.evaluator.harness import stages  # noqa: E402
from kloop.evaluator.harness.pipeline import evaluate  # noqa: E402


def _entries(root: Path) -> dict[str, dict]:
    out = {}
    for d in sorted(root.iterdir()):
        files = sorted(p.name for p in d.iterdir())
        meta = {}
        for j in d.glob("*.json"):
            try:
                data = json.loads(j.read_text())
            except ValueError:
                continue
            if isinstance(data, dict) and "name" in data:
                meta = data
        out[d.name] = {"files": files, "meta": meta}
    return out


def main() -> int:
    # The prime's failure (its stderr tail) is logged at INFO by evaluator.stages.
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
    seen: dict = {}
    prime = stages.prime_pass

    def observed(run, job):
        prime(run, job)
        seen["root"] = run.root / "triton"
        seen["after_prime"] = _entries(seen["root"])

    stages.prime_pass = observed
    r = evaluate("L3/1", candidate("mlp_triton.py"),
                 cpu_config(Path(tempfile.mkdtemp()) / "cache", device="cuda",
                            jit_prime="auto", keep_workdir=True))
    print("status", r.status, r.error.message if r.error else "", flush=True)
    if "root" not in seen:
        print("the prime did not run")
        return 1
    final = _entries(seen["root"])
    primed = seen["after_prime"]
    for key, e in final.items():
        tag = "prime" if key in primed else "added"
        print(f"{tag} {key} {e['files']}")
        print("   ", json.dumps({k: v for k, v in e["meta"].items() if k != "shared"},
                                 sort_keys=True, default=str)[:1500])
    for key, e in final.items():
        if key in primed or not e["meta"]:
            continue
        for pkey, p in primed.items():
            if p["meta"].get("name") != e["meta"].get("name"):
                continue
            diff = {k: (p["meta"].get(k), e["meta"].get(k))
                    for k in set(p["meta"]) | set(e["meta"]) if p["meta"].get(k) != e["meta"].get(k)}
            print(f"diff {pkey[:8]} (prime) vs {key[:8]} (added): {json.dumps(diff, default=str)[:2000]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
