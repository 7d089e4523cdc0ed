"""Evaluator throughput on a fixed batch of fresh candidates (`bench/acceptance.py` reads it).

    python bench/throughput.py [--device cuda] [--concurrency 4] [--kloop-root PATH] [--json F]
                               [--compare FIELD=A,B] [--first N] [--warm-baselines]
                               [--sizes examples|full] [--cuda-form torch|lean] [--ahead N] [--eval KEY=VALUE ...]
    python bench/throughput.py --list

The batch, all from files in this repo (30 candidates, 7 problems): the bundled examples'
scripted Triton kernels for L3/1, L3/4, L3/13, L3/17 and L3/43 in all five variants (a syntax
error, a crash, a wrong kernel, a plain and a faster correct one; at the examples' sizes), three
CUDA `load_inline` candidates (L3/1 MLP, L3/43 attention, L3/8 ResNet block; full or medium
sizes, built cold: every run starts with an empty cache) and two plain-PyTorch candidates (the
references of L3/35 LSTM and L3/4 LeNet as candidates, full size).

Printed: candidates per GPU-hour (batch size over the wall time of the batch through the
evaluator's scheduler: `--concurrency` evaluations in their device stages, `--ahead` more
running their static checks and builds ahead of them), the GPU's busy fraction (`nvidia-smi` utilisation sampled every 0.5 s while the
batch runs), per-stage p50/p90 and the statuses. With `--kloop-root`, the same batch is run
first through that checkout's evaluator (for example `git worktree add /tmp/old <commit>`) in a
fresh process, under the same load, and the ratios are printed. With `--compare FIELD=A,B`,
the batch runs through this checkout twice, with the evaluator setting FIELD at A and then at B
(`construct_at=under_lock,auto`: candidate children build their models before the lock;
`ahead=0,8`: the scheduler's look-ahead, 0 being one pool of `--concurrency`), and the ratio is
printed.
`--first N` takes only the first N candidates (a smoke run). `--warm-baselines` times each
problem's baselines (its reference stage alone) before the clock starts, so the batch finds them
cached, as a long run does after its first candidate of each problem or `kloop baseline`.
With both `--compare` and `--warm-baselines`, one warm-up serves both passes (its baseline
records are copied into each pass's fresh cache, nothing else is). `--baselines-cache DIR`
keeps that warm-up in DIR for later runs (`--warm-only`: warm it and stop), so one device call
can warm and the next one time the batch in full.
`--sizes full` judges the 25 Triton candidates at their problems' own sizes (as a run does)
instead of the examples' small ones, where an evaluation is nearly all fixed costs and the GPU
idles whatever the harness does. `--cuda-form lean` swaps the three CUDA candidates for the
same kernels in the form the CUDA prompt asks for since e01758c (a torch-free `.cu`, built
lean in ~10 s instead of ~40 s).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# This directory holds bench/evaluator.py, which would shadow the `evaluator` package.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

MLP_MEDIUM = {"batch_size": 64, "input_size": 4096, "layer_sizes": [4096, 4096],
              "output_size": 2048}
STAGES = ["static", "build_wait", "compile", "reference", "device_wait", "load",
          "correctness", "first_trial", "trial_random", "trial_reparam", "probes",
          "trials_judged", "trials_after", "timing", "timing_warmup", "timing_rounds", "timing_calls",
          "profile", "candidate", "reference_start", "reference_held", "reference_shared", "candidate_start",
          "candidate_held", "baseline_server_start", "baseline_server_held"]
"""`<mode>_held`: lock taken -> child gone (start-up on the device and exit included);
`reference_shared`: the same for a reference worker that held it shared (`reference_hold`);
`baseline_server_*`: a kept baseline worker's start and its lock holds, on the evaluation that
started it (`evaluator.harness.servers`);
`<mode>_start`: spawn -> ready, before the lock; `first_trial`: the part of `correctness` up to
the first trial's result (on a GPU the trial that counts launches under the profiler);
`trial_<kind>`, `probes`, `trials_after`: the candidate child's time before each trial's,
each probe's and its last report (parts of `correctness`), `trials_judged` the harness's own;
`timing_warmup`, `timing_rounds`: the parts of `timing` before and in the paired rounds, and
`timing_calls` the part of the rounds inside the sides' calls."""
LOCKED = ["ref_reference", "ref_baselines", "load", "correctness", "timing", "profile"]
"""Stages inside a device-lock hold (what a long hold is made of)."""


def batch(sizes: str = "examples", cuda_form: str = "torch") -> list[dict]:
    """[{label, problem, source, overrides}] (read from this repo only). `sizes`: the Triton
    candidates at the examples' small sizes (`examples`) or at their problems' own (`full`).
    `cuda_form`: the three CUDA candidates as the batch was fixed (`torch`: their `.cu` uses
    torch's API, built the plain way) or in the form the CUDA prompt asks for since e01758c
    (`lean`: the same kernels in a torch-free `.cu`, the wrappers in `cpp_sources`)."""
    sys.path[:0] = [str(REPO)]
    from kloop.agent.demo.kernels import SIZES, source
    from kloop.problems.registry import get_problem, reference_as_candidate

    out = [{"label": f"{pid} triton {v}", "problem": pid, "source": source(pid, v),
            "overrides": SIZES[pid] if sizes == "examples" else {}}
           for pid in SIZES for v in ("syntax", "crash", "wrong", "ok", "ok_fast")]
    cands = REPO / "tests" / "evaluator" / "candidates"
    for pid, name, sizes in [("L3/1", "mlp_cuda_relu.py", MLP_MEDIUM),
                             ("L3/43", "attention_cuda.py", {}),
                             ("L3/8", "resnet_block_bn_relu_cuda.py", {})]:
        name = name.replace(".py", "_lean.py") if cuda_form == "lean" else name
        out.append({"label": f"{pid} cuda {name}", "problem": pid,
                    "source": (cands / name).read_text(), "overrides": sizes})
    for pid in ("L3/35", "L3/4"):
        out.append({"label": f"{pid} torch reference", "problem": pid,
                    "source": reference_as_candidate(get_problem(pid).path.read_text()), "overrides": {}})
    return out


def warm_baselines(items: list[dict], device: str, concurrency: int, cache: Path,
                   settings: dict | None = None) -> float:
    """Steady state before the clock starts: every problem configuration's kept baseline worker
    started in this process (`evaluator.tools.warmup` with `keep`, what `kloop run` does for the
    problems it starts with), its baselines timed or found in the batch's cache and compiled
    once; where none may be kept, the baselines timed alone (what `kloop baseline` runs). It
    also brings the template process up. Judging each reference as
    a candidate as well, as this did before 362da27, added ~100 timed calls per problem under the
    device lock and changed nothing the batch then finds. Returns the seconds it took."""
    from kloop.evaluator.common.config import EvalConfig
    from kloop.evaluator.tools.warmup import warm_up
    from kloop.problems.registry import get_problem

    seen = {(it["problem"], json.dumps(it["overrides"], sort_keys=True)): it for it in items}
    jobs = [(get_problem(it["problem"]), EvalConfig(
        device=device, cache_dir=cache, problem_overrides=it["overrides"], **(settings or {})))
        for it in seen.values()]

    def said(w) -> None:
        what = f"warm {w.problem_id}"
        if w.reference is None:  # the batch then times this problem's baselines itself
            print(f"{what}: failed: {w.error}"[:300], file=sys.stderr, flush=True)
            return
        ref = w.reference
        eager = f"{ref.eager.median_ms:.3f} ms" if ref.eager is not None else "none"
        top = ", ".join(f"{k} {v:.1f}" for k, v in
                        sorted(ref.stage_seconds.items(), key=lambda kv: -kv[1])[:3])
        print(f"{what}: eager {eager} in {w.seconds:.1f} s ({top})", file=sys.stderr, flush=True)

    return warm_up(jobs, concurrency, rebuild=False, on_done=said, catch=(Exception,),
                   keep=True)[1]


def seed_baselines(src: Path, dst: Path) -> int:
    """Copy the baseline records a warm-up left in cache `src` into cache `dst` (only those:
    builds, Triton and inductor caches stay behind, so a pass still builds everything fresh).
    Both passes of a `--compare` then warm in seconds instead of compiling every problem's
    baselines twice (~340 s for the whole batch on the H200). Returns how many were copied."""
    import shutil

    from kloop.evaluator.common.vault import private_dir

    to = private_dir(dst) / "baselines"
    to.mkdir(parents=True, exist_ok=True)
    records = sorted((private_dir(src) / "baselines").glob("*.json"))
    for f in records:
        shutil.copy2(f, to / f.name)
    return len(records)


@dataclasses.dataclass(frozen=True)
class Api:
    """The evaluator a batch runs through, and the checkout it was imported from."""

    config: type
    evaluate: Callable
    scheduler: type | None
    root: Path


OLD_PACKAGE = "evaluator"
"""The old layout's top-level package name."""
OLD_API = False
"""Set by `--inner --old-api`: the checkout predates one import name (2026-12-05, 6421523;
69bdd97, the old path of record, is one) and has its evaluator as the top-level package
`evaluator` (`evaluator.config`, `evaluator.pipeline`), with no scheduler."""


def evaluator_api() -> Api:
    """This layout's evaluator (`kloop.evaluator`), or an old checkout's (`OLD_API`)."""
    if OLD_API:
        # Another checkout's package, by name, in a process whose PYTHONPATH is that checkout
        # (checked against `--root`): never this clone's modules under a second name.
        import importlib

        config = importlib.import_module(f"{OLD_PACKAGE}.config")
        pipeline = importlib.import_module(f"{OLD_PACKAGE}.pipeline")
        return Api(config.EvalConfig, pipeline.evaluate, None,
                   Path(config.__file__).resolve().parents[1])
    import kloop.evaluator as package
    from kloop.evaluator.common.config import EvalConfig
    from kloop.evaluator.harness.pipeline import evaluate

    try:
        from kloop.evaluator.procs.scheduler import Scheduler
    except ImportError:  # a checkout from before the scheduler
        Scheduler = None  # noqa: N806
    return Api(EvalConfig, evaluate, Scheduler, Path(package.__file__).resolve().parents[1])


def old_api(root: Path) -> bool:
    """Whether checkout `root` has the old layout (no `evaluator/common/config.py`)."""
    return not (root / "evaluator" / "common" / "config.py").is_file()


def run_batch(items: list[dict], device: str, concurrency: int, rows_file: Path | None = None,
              settings: dict | None = None, warm: bool = False, ahead: int | None = None,
              baselines_from: Path | None = None, cache_dir: Path | None = None,
              row_of=None, on_row=None) -> dict:
    """Evaluate the batch with the evaluator importable here; per-candidate numbers and wall.
    Each finished row is also appended to `rows_file` (a run cut short by a time limit still
    leaves what it finished). `warm`: baselines first (`warm_baselines`), off the clock.
    `concurrency` evaluations at once in their device stages, up to `ahead` more building
    ahead of them (`evaluator.procs.scheduler`; a checkout without it: one pool of `concurrency`).
    `cache_dir`: the evaluator's cache (default: a fresh one, gone after); `row_of(result)`:
    more fields for each finished row; `on_row(res)`: told after each finished row what
    `run_batch` would return if the batch ended there (`wall_s`: the last row's finish)."""
    EvalConfig = evaluator_api().config  # noqa: N806

    with contextlib.ExitStack() as stack:
        cache = str(cache_dir) if cache_dir is not None else stack.enter_context(
            tempfile.TemporaryDirectory(prefix="kloop-throughput-"))
        if baselines_from is not None:
            n = seed_baselines(baselines_from, Path(cache))
            print(f"{n} baseline records from the shared warm-up", file=sys.stderr, flush=True)
        warm_s = warm_baselines(items, device, concurrency, Path(cache),
                                settings) if warm else None
        if warm_s is not None:  # stderr reaches the step's log as it happens (a cut run too)
            print(f"baselines warmed in {warm_s:.1f} s", file=sys.stderr, flush=True)
        rows_lock = threading.Lock()
        rows: dict[int, dict] = {}

        def record(i: int, item: dict, t0: float, future) -> None:
            try:
                r = future.result()
                status, stages, flags = r.status, dict(r.stage_seconds), list(r.flags)
                extra = row_of(r) if row_of is not None else {}
            except Exception as e:  # an evaluator fault is a row too, not the end of the run
                status, stages, flags = f"error: {type(e).__name__}: {e}"[:120], {}, []
                extra = {}
            row = {"label": item["label"], "status": status, "stages": stages, "flags": flags,
                   "wall_s": time.monotonic() - t0, "done_at_s": time.monotonic() - start,
                   **extra}
            with rows_lock:
                rows[i] = row
                print(f"{row['done_at_s']:7.1f} s  {item['label']:42} {status}", file=sys.stderr,
                      flush=True)
                if rows_file is not None:
                    with rows_file.open("a") as f:
                        f.write(json.dumps(row) + "\n")
                if on_row is not None:
                    on_row({"wall_s": row["done_at_s"], "started_at": started_at,
                            "rows": [rows[k] for k in sorted(rows)], "warm_s": warm_s})

        start, started_at = time.monotonic(), time.time()
        with _pool(concurrency, ahead) as submit:
            for i, item in enumerate(items):
                cfg = EvalConfig(device=device, cache_dir=Path(cache),
                                 problem_overrides=item["overrides"], **(settings or {}))
                t0 = time.monotonic()  # `wall_s` counts the queue, as the batch's wall does
                submit(item["problem"], item["source"], cfg).add_done_callback(
                    lambda f, i=i, item=item, t0=t0: record(i, item, t0, f))
        return {"wall_s": time.monotonic() - start, "rows": [rows[i] for i in sorted(rows)],
                "started_at": started_at, "warm_s": warm_s}


def inner_run(root: Path, batch_file: Path, device: str, concurrency: int,
              *extra: str) -> subprocess.CompletedProcess:
    """This script's `--inner` run of a batch file with the evaluator of checkout `root`, in a
    process of its own (its result on stdout's last line; progress on stderr); a root of the old
    layout is run through its own API (`old_api`)."""
    root = root.resolve()
    return subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--inner", str(batch_file), "--device",
         device, "--concurrency", str(concurrency), "--root", str(root),
         *(["--old-api"] if old_api(root) else []), *extra],
        stdout=subprocess.PIPE, text=True, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})


@contextlib.contextmanager
def _pool(concurrency: int, ahead: int | None):
    """`submit(problem, source, config) -> Future`: the evaluator's scheduler where this checkout
    has one, else (`--kloop-root` of an older commit) `concurrency` threads calling `evaluate`."""
    api = evaluator_api()
    if api.scheduler is None:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(concurrency) as pool:
            yield lambda *a: pool.submit(api.evaluate, *a)
        return
    with api.scheduler(concurrency, ahead) as sched:
        yield sched.submit


class GpuSampler:
    """`nvidia-smi` utilisation every 0.5 s (none where there is no nvidia-smi)."""

    def __init__(self) -> None:
        self.samples: list[tuple[float, float]] = []  # (time.time(), utilisation %)
        self._proc: subprocess.Popen | None = None
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GpuSampler:
        try:
            self._proc = subprocess.Popen(
                ["nvidia-smi", "--query-gpu=utilization.gpu", "--format=csv,noheader,nounits",
                 "-lms", "500", "-i", "0"], stdout=subprocess.PIPE, text=True,
                stderr=subprocess.DEVNULL)
        except OSError:
            return self
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()
        return self

    def _read(self) -> None:
        assert self._proc is not None and self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                self.samples.append((time.time(), float(line.strip())))
            except ValueError:
                pass

    def __exit__(self, *exc) -> None:
        if self._proc is not None:
            self._proc.terminate()
            self._proc.wait()

    def busy(self, since: float = 0.0) -> float | None:
        """The busy fraction of the samples taken after `since` (the batch's start)."""
        samples = [u for t, u in self.samples if t >= since]
        return sum(u > 0 for u in samples) / len(samples) if samples else None


def _pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))] if values else 0.0


def lock_held(row: dict) -> float:
    """Seconds one candidate's evaluation held the device lock alone (its reference's where it
    was not shared, its own, and a kept baseline worker's start where it started one); a
    shared reference hold (`reference_shared`) overlaps others and is not counted. A candidate's
    hold under `candidate_hold: untimed_shared` lets outputs-only workers beside its untimed
    start but no other candidate: it is counted whole, the queue all the same."""
    return sum(row["stages"].get(k, 0.0)
               for k in ("reference_held", "candidate_held", "baseline_server_held"))


def report(name: str, res: dict, n: int) -> dict:
    rows = res["rows"]
    per_hour = n / res["wall_s"] * 3600
    busy = res.get("gpu_busy")
    print(f"\n== {name}: {n} candidates in {res['wall_s']:.1f} s = {per_hour:.0f} per GPU-hour; "
          f"GPU busy {'-' if busy is None else f'{busy:.0%}'} of 0.5 s samples ==")
    print(f"{'stage':16} {'p50 s':>7} {'p90 s':>7} {'n':>3}")
    for s in STAGES:
        v = [r["stages"][s] for r in rows if s in r["stages"]]
        if v:
            print(f"{s:16} {statistics.median(v):7.2f} {_pct(v, 0.9):7.2f} {len(v):3}")
    walls = [r["wall_s"] for r in rows]
    print(f"{'end to end':16} {statistics.median(walls):7.2f} {_pct(walls, 0.9):7.2f} {len(walls):3}")
    # The exclusive lock is the queue: what each candidate held it for bounds the rate.
    holds = [(lock_held(r), r) for r in rows]
    held = [h for h, _ in holds if h > 0]
    if held:
        total = sum(held)
        print(f"{'held excl.':16} {statistics.median(held):7.2f} {_pct(held, 0.9):7.2f} "
              f"{len(held):3}   sum {total:.1f} s of {res['wall_s']:.1f} s wall: at most "
              f"{n / total * 3600:.0f} per GPU-hour while the lock is the queue")
        # Who held it: on the H200 at c8554dc two full-size candidates held 69 % of the wall.
        for h, r in sorted((hr for hr in holds if hr[0] > 0), key=lambda hr: -hr[0])[:3]:
            inner = sorted(((k, v) for k, v in r["stages"].items() if k in LOCKED and v >= 0.05),
                           key=lambda kv: -kv[1])
            print(f"  longest hold: {r['label']} {h:.1f} s ({h / total:.0%} of the holds): "
                  + ", ".join(f"{k} {v:.1f}" for k, v in inner[:4]))
    # A candidate built ahead that had to be built again under the lock pays twice; the first
    # reason says why (on the H200 at c121bf3 it named the torch.cuda query behind each retry).
    again = [f for r in rows for f in r.get("flags", []) if f.startswith("constructed_under_lock")]
    if again:
        print(f"built again under the lock: {len(again)} of {n}; first: {again[0][:300]}")
    for r in rows:
        print(f"  {r['label']:42} {r['status']:16} {r['wall_s']:6.1f} s")
    return {"per_hour": per_hour, "busy": busy, "wall_s": res["wall_s"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--kloop-root", type=Path, help="another checkout to run the batch through")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--rows", type=Path, help="append each finished candidate's row here")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--compare", metavar="FIELD=A,B",
                    help="run the batch with the evaluator setting FIELD at A, then at B, and "
                         "print the ratio (e.g. construct_at=under_lock,auto or "
                         "l2_flush=worker,trusted)")
    ap.add_argument("--first", type=int, help="only the first N candidates")
    ap.add_argument("--ahead", type=int, help="evaluations building ahead of the --concurrency "
                    "ones on the device (default: the build slots, half the cores; 0: one pool "
                    "of --concurrency, as before the scheduler). `--compare ahead=0,8` runs both")
    ap.add_argument("--sizes", choices=("examples", "full"), default="examples",
                    help="the 25 Triton candidates at the examples' small sizes, where an "
                         "evaluation is mostly fixed costs, or at their problems' own sizes, "
                         "as a run judges them (the other five are the same either way)")
    ap.add_argument("--cuda-form", choices=("torch", "lean"), default="torch",
                    help="the CUDA candidates as fixed (their .cu uses torch) or as the CUDA "
                         "prompt asks for them (a torch-free .cu, built lean)")
    ap.add_argument("--warm-baselines", action="store_true",
                    help="time each problem's baselines (its reference stage alone) before the "
                         "clock starts, so that the batch finds them cached (a long run's "
                         "steady state)")
    ap.add_argument("--trace", type=Path, help="append each candidate child's messages (arrival "
                    "and judging time, `evaluator.harness.stages` debug log) here")
    ap.add_argument("--eval", action="append", default=[], metavar="KEY=VALUE",
                    help="an EvalConfig setting for every pass of this checkout (a JSON value "
                         "or a string), e.g. baselines=eager: a --compare whose warm-up "
                         "compiles no torch.compile baselines")
    ap.add_argument("--settings", default="{}", help=argparse.SUPPRESS)
    ap.add_argument("--inner", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--old-api", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--root", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--warm-into", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--baselines-from", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--baselines-cache", type=Path, metavar="DIR",
                    help="with --warm-baselines: warm into DIR and keep it (a later run with "
                         "the same DIR finds every baseline there and warms in seconds)")
    ap.add_argument("--warm-only", action="store_true",
                    help="with --baselines-cache: warm it, then stop (no batch)")
    args = ap.parse_args()
    if args.inner:  # run a batch file with the evaluator of checkout --root
        global OLD_API
        OLD_API = args.old_api
        if args.root is not None and (got := evaluator_api().root) != args.root.resolve():
            # Never a figure of another checkout's code under this one's name (an installed
            # kloop comes after PYTHONPATH, but an editable finder comes first).
            print(f"the evaluator was imported from {got}, not from {args.root}", file=sys.stderr)
            return 2
        if args.trace:
            import logging

            handler = logging.FileHandler(args.trace)
            handler.setFormatter(logging.Formatter("%(relativeCreated)d ms %(message)s"))
            logger = logging.getLogger("kloop.evaluator.harness.stages")
            logger.setLevel(logging.DEBUG)
            logger.addHandler(handler)
        items = json.loads(args.inner.read_text())
        if args.warm_into:  # the shared warm-up of a --compare: baselines only, no clock
            warm_s = warm_baselines(items, args.device, args.concurrency, args.warm_into,
                                    json.loads(args.settings))
            print(json.dumps({"warm_s": warm_s}))
            return 0
        settings = json.loads(args.settings)
        ahead = settings.pop("ahead", args.ahead)  # the scheduler's, not an EvalConfig field
        print(json.dumps(run_batch(items, args.device, args.concurrency, args.rows, settings,
                                   args.warm_baselines, None if ahead is None else int(ahead),
                                   args.baselines_from)))
        return 0
    items = batch(args.sizes, args.cuda_form)
    items = items[:args.first] if args.first else items
    if args.list:
        for it in items:
            print(f"{it['label']:42} {it['overrides']}")
        print(f"{len(items)} candidates, {len({it['problem'] for it in items})} problems")
        return 0
    common = {}  # --eval KEY=VALUE: every pass of this checkout, and the shared warm-up
    for kv in args.eval:
        key, _, value = kv.partition("=")
        try:
            common[key] = json.loads(value)
        except ValueError:
            common[key] = value
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "batch.json"
        path.write_text(json.dumps(items))
        # Settings go only to this checkout's inner run (a baseline checkout runs its own
        # defaults); with --compare, this checkout runs twice, at A and then at B.
        passes: list[tuple[str, Path, dict | None]] = []
        if args.kloop_root:
            passes.append(("baseline", args.kloop_root.resolve(), None))
        if args.compare:
            field, _, values = args.compare.partition("=")
            a, _, b = values.partition(",")
            if not (field and a and b):
                ap.error("--compare wants FIELD=A,B")
            passes += [(f"{field}={a}", REPO, {**common, field: a}),
                       (f"{field}={b}", REPO, {**common, field: b})]
        else:
            passes.append(("this checkout", REPO, common))
        def inner(root: Path, *extra: str) -> subprocess.CompletedProcess:
            """This script's `--inner` run of the batch with the evaluator of checkout `root`
            (its result on stdout's last line; progress on stderr)."""
            return inner_run(root, path, args.device, args.concurrency, *extra)

        shared = None
        if args.warm_only and not (args.baselines_cache and args.warm_baselines):
            ap.error("--warm-only wants --warm-baselines and --baselines-cache")
        if args.warm_baselines and (args.compare or args.baselines_cache):
            # One warm-up for every pass of this checkout: its baseline records are copied
            # into each pass's fresh cache, whose own warm-up then finds them (seconds). A
            # --baselines-cache outlives this run, so the next one skips the ~340 s of
            # torch.compile baselines, as a long run does after `kloop baseline`.
            shared = (args.baselines_cache.resolve() if args.baselines_cache
                      else Path(tmp) / "warm")
        kept = shared is not None and not args.warm_only and any(
            (shared / "private" / "baselines").glob("*.json"))
        if kept:  # a kept warm-up: the passes' own warm-ups add whatever it lacks
            print(f"baselines kept in {shared}: no shared warm-up", flush=True)
        elif shared is not None:
            w = inner(REPO, "--warm-into", str(shared), "--settings", json.dumps(common))
            if w.returncode != 0:
                print(f"the shared warm-up failed ({w.returncode}); its output is above")
                return 1
            warm_s = json.loads(w.stdout.strip().splitlines()[-1])["warm_s"]
            print(f"shared warm-up: every problem's baselines in {warm_s:.1f} s", flush=True)
            if args.warm_only:
                return 0
        for name, root, settings in passes:
            with GpuSampler() as gpu:
                p = inner(root,
                          *(["--ahead", str(args.ahead)] if args.ahead is not None else []),
                          *(["--settings", json.dumps(settings)] if settings else []),
                          *(["--warm-baselines"] if args.warm_baselines else []),
                          *(["--baselines-from", str(shared)] if shared and root == REPO else []),
                          *(["--rows", str(args.rows.resolve())] if args.rows else []),
                          *(["--trace", str(args.trace.resolve())] if args.trace else []))
            if p.returncode != 0:
                print(f"{name}: failed ({p.returncode}); its output is above")
                return 1
            res = json.loads(p.stdout.strip().splitlines()[-1])
            res["gpu_busy"] = gpu.busy(since=res.get("started_at", 0.0))
            if res.get("warm_s") is not None:
                print(f"{name}: baselines warmed in {res['warm_s']:.1f} s before the clock started")
            results[name] = report(name, res, len(items))
    names = list(results)
    for other in names[:-1]:
        last = results[names[-1]]
        print(f"\n{names[-1]} / {other}: {last['per_hour'] / results[other]['per_hour']:.2f}x "
              f"candidates per GPU-hour")
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
