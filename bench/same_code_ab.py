"""The A/B loop of the same-code diagnostics (bench/diag_trials.py, bench/diag_threads.py).

The reference's own code is submitted as the candidate and evaluated (strict, eager baseline)
under each variant in turn, alternating, `repeats` times. A variant is a context manager that
sets up what differs (inside this process only). Printed per evaluation: the candidate process's
own event median, the trusted median, the reference worker's event median, their ratio and the
speedup of identical code (1.000 is fair); then the median ratio per variant.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from clock import MODELS, honest_source
from kloop.evaluator.common.config import EvalConfig
from kloop.evaluator.harness.pipeline import evaluate

Variant = Callable[[], AbstractContextManager]


def run(variants: dict[str, Variant], only: list[str], repeats: int, device: str,
        cache_dir: Path) -> None:
    print(f"{'model':<12} {'variant':>8} {'cand ev':>8} {'trusted':>8} {'ref ev':>8} "
          f"{'cand/ref ev':>11} {'speedup':>8}", flush=True)
    for label, pid, overrides in MODELS:
        if label not in only:
            continue
        cfg = EvalConfig(device=device, baselines="eager", profile=False, cache_dir=cache_dir,
                         problem_overrides=overrides)
        ratios: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(repeats):
            for name, variant in variants.items():
                with variant():
                    r = evaluate(pid, honest_source(pid), cfg)
                t, e = r.timing, r.eager
                if r.status != "correct" or t is None or e is None:
                    print(f"{label:<12} {name:>8} {r.status}: {r.error}", flush=True)
                    continue
                cand, ref = t.worker_event_median_ms, e.worker_event_median_ms
                ratio = cand / ref if cand and ref else float("nan")
                ratios[name].append(ratio)
                print(f"{label:<12} {name:>8} {cand or 0:>8.4f} {t.median_ms:>8.4f} "
                      f"{ref or 0:>8.4f} {ratio:>11.3f} {r.speedup_vs_eager or 0:>8.3f}",
                      flush=True)
        for name, vals in ratios.items():
            if vals:
                print(f"{label:<12} {name:>8} median cand/ref events "
                      f"{statistics.median(vals):.3f}", flush=True)
