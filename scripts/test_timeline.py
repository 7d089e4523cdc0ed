"""Where a test run's workers sat idle: reads the file `KLOOP_TEST_TIMELINE=FILE make test` wrote
(tests/conftest.py) and prints, per xdist worker, its busy and idle seconds and when it finished,
then the longest gaps and the tests each worker ran last.

    python scripts/test_timeline.py /tmp/timeline.jsonl
"""

from __future__ import annotations

import json
import sys
from collections import defaultdict


def main(path: str) -> int:
    rows = [json.loads(line) for line in open(path)]
    rows = [r for r in rows if r["worker"] != "main"]  # the controller echoes the workers' tests
    if not rows:
        print("no worker rows")
        return 1
    t0 = min(r["start"] for r in rows)
    by: dict[str, list[dict]] = defaultdict(list)
    for r in rows:
        by[r["worker"]].append(r)
    gaps = []
    for w, rs in sorted(by.items()):
        rs.sort(key=lambda r: r["start"])
        busy = sum(r["end"] - r["start"] for r in rs)
        end = rs[-1]["end"] - t0
        print(f"{w}: {len(rs)} tests, busy {busy:.0f} s, finished at {end:.0f} s, idle {end - busy:.0f} s")
        for a, b in zip(rs, rs[1:], strict=False):
            gaps.append((b["start"] - a["end"], w, a["test"], b["test"], a["end"] - t0))
        for r in rs[-5:]:
            print(f"   last: {r['start'] - t0:7.0f} s +{r['end'] - r['start']:6.1f} s  {r['test']}")
    print("longest gaps between a worker's tests:")
    for g, w, a, _next, at in sorted(gaps, reverse=True)[:10]:
        print(f"  {g:6.1f} s on {w} at {at:.0f} s, after {a}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
