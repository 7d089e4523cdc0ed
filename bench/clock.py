"""The trusted clock beside CUDA events (GPU machine): does the harness's clock, net of its
handshake, measure what CUDA events measure, and what does it cost below 1 ms?

    python bench/clock.py [--repeats 1] [--only L3/1-b64,...]

For each honest model (the reference's own code submitted as the candidate), sized from ~0.05
to ~20 ms per forward, one `strict` evaluation gives the harness's numbers (median net of the
handshake, the handshake, the worker's own event median); then, in this process, the same
model is timed the KernelBench way (CUDA events around each call, L2 flushed, 100 calls; seed-42
build, so it is KernelBench's own number). Printed side by side with their ratio. The
`kernelbench` policy's eager baseline mean is compared with KernelBench's event mean the same
way (the target: agreement within 3 % on L3/1 and L3/4). `tf/plain` is the median with
`l2_flush: trusted` (the harness's flusher process flushes too) over the median without, and
`tf sp` that run's speedup of the same code.

    python bench/clock.py --kb [--repeats 3] [--only L3/1,L3/4]

prints only the `kernelbench` policy's numbers, which divide the workers' CUDA events bounded
by the trusted clock (`result.BoundedEvents`), beside KernelBench's own event mean in this
process, `--repeats` times per model: the eager baseline's and the same code's (as a
candidate) bounded-event means, their ratios to KernelBench's, the same code's speedup, the
bound and how many calls it moved up.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO)]

import torch  # noqa: E402

from kloop.evaluator.common.config import EvalConfig  # noqa: E402
from kloop.evaluator.harness.pipeline import evaluate  # noqa: E402
from kloop.evaluator.worker.construct import as_output_list  # noqa: E402
from kloop.problems.registry import get_problem, reference_as_candidate  # noqa: E402

MLP = {"input_size": 4096, "layer_sizes": [4096, 4096], "output_size": 2048}
MODELS = [
    ("L3/1-b8", "L3/1", {"batch_size": 8, "input_size": 1024, "layer_sizes": [1024],
                         "output_size": 1024}),
    ("L3/1-b64", "L3/1", {"batch_size": 64, **MLP}),
    ("L3/1-b1024", "L3/1", {"batch_size": 1024, **MLP}),
    ("L3/1-b8192", "L3/1", {"batch_size": 8192, **MLP}),
    ("L3/1", "L3/1", {}),
    ("L3/4", "L3/4", {}),
    ("L3/13", "L3/13", {}),
    ("L3/11", "L3/11", {}),
    ("L3/35", "L3/35", {}),
]


def honest_source(problem_id: str) -> str:
    """The reference module with its Model renamed ModelNew (an honest, plain-PyTorch candidate)."""
    return reference_as_candidate(get_problem(problem_id).path.read_text())


def kernelbench_events(problem_id: str, overrides: dict, trials: int = 100) -> tuple[float, float]:
    """(median, mean) ms of CUDA-event timings in this process, KernelBench's way."""
    problem = get_problem(problem_id)
    module = problem.load_module(overrides)
    torch.manual_seed(42)
    init = module.get_init_inputs()
    torch.manual_seed(42)
    model = module.Model(*init).cuda()
    torch.manual_seed(42)
    inputs = [x.cuda() if isinstance(x, torch.Tensor) else x for x in module.get_inputs()]
    flush = torch.empty(int(torch.cuda.get_device_properties(0).L2_cache_size) // 4 * 4,
                        dtype=torch.int32, device="cuda")
    times = []
    with torch.no_grad():
        for _ in range(3):
            as_output_list(model(*inputs))
        torch.cuda.synchronize()
        for _ in range(trials):
            flush.zero_()
            torch.cuda.synchronize()
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            model(*inputs)
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
    del model
    torch.cuda.empty_cache()
    return statistics.median(times), statistics.fmean(times)


def kb_table(models, args) -> int:
    print(f"{'model':<12} {'KB mean':>8} | {'eager ev':>8} {'ratio':>6} | {'cand ev':>8} "
          f"{'ratio':>6} | {'speedup':>7} {'clock':>14} | {'bound':>6} {'raised c/e':>10} | "
          f"{'eager floor':>11} {'ratio':>6} | {'serve c/e':>11} {'raw ev c/e':>15}", flush=True)
    for label, pid, overrides in models:
        cfg = EvalConfig(device="cuda", policy="kernelbench", baselines="eager", profile=False,
                         cache_dir=args.cache_dir, problem_overrides=overrides)
        for _ in range(args.repeats):
            r = evaluate(pid, honest_source(pid), cfg)
            _, kb_mean = kernelbench_events(pid, overrides)
            t, e = r.timing, r.eager
            if r.status != "correct" or t is None or e is None or not t.events or not e.events:
                print(f"{label:<12} {r.status}: no bounded events "
                      f"({r.error.message if r.error else r.speedup_clock})", flush=True)
                continue
            print(f"{label:<12} {kb_mean:>8.4f} | {e.events.mean_ms:>8.4f} "
                  f"{e.events.mean_ms / kb_mean:>6.3f} | {t.events.mean_ms:>8.4f} "
                  f"{t.events.mean_ms / kb_mean:>6.3f} | {r.speedup_vs_eager or 0:>7.3f} "
                  f"{r.speedup_clock:>14} | {e.events.bound_ms:>6.3f} "
                  f"{t.events.raised:>4}/{e.events.raised:<5} | {e.mean_ms:>11.4f} "
                  f"{e.mean_ms / kb_mean:>6.3f} | {_serve(t):>5.3f}/{_serve(e):<5.3f} "
                  f"{t.worker_event_median_ms or 0:>7.4f}/{e.worker_event_median_ms or 0:<7.4f}",
                  flush=True)
    return 0


def _serve(t) -> float:
    """Median wall time less median events: the serving each call adds outside its events."""
    return (t.raw_median_ms or 0.0) - (t.worker_event_median_ms or 0.0)


def _mhz(stats) -> str:
    """The SM clock the harness read (NVML) before the first and after the last timed call."""
    b, a = (getattr(stats, k, None) if stats is not None else None for k in ("gpu_before",
                                                                           "gpu_after"))
    return f"{getattr(b, 'sm_clock_mhz', None)}/{getattr(a, 'sm_clock_mhz', None)}"


def _f(stats, name: str) -> str:
    v = getattr(stats, name, None) if stats is not None else None
    return f"{v:>8.4f}" if v is not None else f"{'-':>8}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", help="comma-separated labels")
    ap.add_argument("--cache-dir", type=Path, default=Path("/tmp/kloop-bench-clock"))
    ap.add_argument("--quick", action="store_true",
                    help="the strict evaluation and the in-process events only (the kernelbench, "
                         "and trusted-flush columns read 0)")
    ap.add_argument("--kb", action="store_true",
                    help="the kernelbench policy's bounded events beside KernelBench's means")
    ap.add_argument("--repeats", type=int, default=1)
    args = ap.parse_args()
    wanted = set(args.only.split(",")) if args.only else None
    if args.kb:
        return kb_table([m for m in MODELS if wanted is None or m[0] in wanted], args)
    print(f"{'model':<12} {'events med':>10} {'trusted':>9} {'ratio':>6} {'handshake':>9} "
          f"{'calibrated':>10} {'worker ev':>9} {'speedup':>7} | {'KB mean':>9} {'kb-policy':>9} "
          f"{'ratio':>6} | {'cand raw':>8} {'cand ev':>8} {'ref raw':>8} {'ref ev':>8} | "
          f"{'tf/plain':>8} {'tf sp':>6} | SM MHz before/after: cand, ref",
          flush=True)
    for label, pid, overrides in MODELS:
        if wanted is not None and label not in wanted:
            continue
        cfg = EvalConfig(device="cuda", baselines="eager", profile=False, cache_dir=args.cache_dir,
                         problem_overrides=overrides)
        strict = evaluate(pid, honest_source(pid), cfg)
        if args.quick:
            kb = flushed = strict.model_copy(update={"eager": None, "timing": None,
                                                            "speedup_vs_eager": None})
        else:
            kb = evaluate(pid, honest_source(pid), cfg.model_copy(update={"policy": "kernelbench"}))
            # The L2 flushed by the harness's own flusher process too (evaluator.harness.flusher).
            flushed = evaluate(pid, honest_source(pid),
                               cfg.model_copy(update={"l2_flush": "trusted"}))
        ev_med, ev_mean = kernelbench_events(pid, overrides)
        t = strict.timing
        if strict.status != "correct" or t is None:
            print(f"{label:<12} strict {strict.status}: {strict.error}", flush=True)
            continue
        kb_mean = kb.eager.mean_ms if kb.eager else float("nan")
        print(f"{label:<12} {ev_med:>10.4f} {t.median_ms:>9.4f} {t.median_ms / ev_med:>6.3f} "
              f"{t.handshake_ms or 0:>9.4f} {t.calibrated_median_ms or 0:>10.4f} "
              f"{t.worker_event_median_ms or 0:>9.4f} {strict.speedup_vs_eager or 0:>7.3f} | "
              f"{ev_mean:>9.4f} {kb_mean:>9.4f} {kb_mean / ev_mean:>6.3f} | "
              f"{t.raw_median_ms or 0:>8.4f} {t.worker_event_median_ms or 0:>8.4f} "
              f"{_f(strict.eager, 'raw_median_ms')} {_f(strict.eager, 'worker_event_median_ms')} | "
              f"{(flushed.timing.median_ms / t.median_ms) if flushed.timing else 0:>8.3f} "
              f"{flushed.speedup_vs_eager or 0:>6.3f} | {_mhz(t)}, {_mhz(strict.eager)}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
