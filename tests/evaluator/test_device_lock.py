"""GPU stages of evaluations in different processes never overlap when they share a lock dir (the
host's, whatever their cache dirs), and do in different ones. Runs on CPU: the lock only looks
at the device name."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

_HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from kloop.evaluator.procs.devicelock import device_lock
    with device_lock("cuda:0", Path(sys.argv[2])):
        start = time.time()
        time.sleep(1.0)
        end = time.time()
    Path(sys.argv[1]).write_text(f"{start} {end}")
""")


def _intervals(tmp_path: Path, lock_dirs: list[Path]) -> list[tuple[float, float]]:
    outs = [tmp_path / f"interval_{i}" for i in range(len(lock_dirs))]
    procs = [subprocess.Popen([sys.executable, "-c", _HOLDER, str(o), str(d)])
             for o, d in zip(outs, lock_dirs, strict=True)]
    assert [p.wait(timeout=60) for p in procs] == [0] * len(procs)
    spans = [tuple(map(float, o.read_text().split())) for o in outs]
    return sorted(spans)  # type: ignore[arg-type]


def _overlaps(spans: list[tuple[float, float]]) -> bool:
    return any(b[0] < a[1] for a, b in zip(spans, spans[1:], strict=False))


def test_a_shared_lock_dir_serialises_processes(tmp_path):
    spans = _intervals(tmp_path, [tmp_path / "locks"] * 3)
    assert not _overlaps(spans), spans
    assert (tmp_path / "locks" / "cuda_0.lock").exists()


def test_processes_with_different_lock_dirs_overlap(tmp_path):
    # The control: the same holders overlap when no lock dir is shared.
    assert _overlaps(_intervals(tmp_path, [tmp_path / f"locks_{i}" for i in range(3)]))


_RUN_HOLDER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from kloop.evaluator.common.config import EvalConfig
    from kloop.evaluator.harness.state import EvalRun
    run = EvalRun.__new__(EvalRun)  # only what gpu_lock reads
    run.config = EvalConfig(cache_dir=Path(sys.argv[2]))
    run.device = "cuda:0"
    with run.gpu_lock():
        start = time.time()
        time.sleep(1.0)
        end = time.time()
    Path(sys.argv[1]).write_text(f"{start} {end}")
""")


def test_runs_with_different_cache_dirs_wait_for_each_other(tmp_path, monkeypatch):
    """The lock belongs to the host and the GPU, not to a cache dir: two experiments with
    caches of their own, on one GPU, never time at once."""
    monkeypatch.setenv("KLOOP_LOCK_DIR", str(tmp_path / "host-locks"))
    outs = [tmp_path / f"interval_{i}" for i in range(3)]
    procs = [subprocess.Popen([sys.executable, "-c", _RUN_HOLDER, str(o),
                               str(tmp_path / f"cache_{i}")]) for i, o in enumerate(outs)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0, 0]
    spans = sorted(tuple(map(float, o.read_text().split())) for o in outs)
    assert not _overlaps(spans), spans
    assert [p.name for p in (tmp_path / "host-locks").glob("*.lock")] == ["gpu_0.lock"]


def test_one_gpu_named_two_ways_has_one_lock(monkeypatch):
    from kloop.evaluator.harness.state import gpu_lock_name

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")  # one process: GPU 1 is its cuda:1
    second, first = gpu_lock_name("cuda:1"), gpu_lock_name("cuda")
    assert first == gpu_lock_name("cuda:0") != second
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")  # another: GPU 1 is its only one
    assert gpu_lock_name("cuda") == gpu_lock_name("cuda:0") == second
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")  # a third sees every GPU
    assert gpu_lock_name("cuda:1") == second and gpu_lock_name("cuda:3") == first
    assert gpu_lock_name("cpu") == "cpu"


def test_a_lock_dir_that_is_not_ours_is_refused(tmp_path, monkeypatch):
    from kloop.evaluator.procs.isolation import host_lock_dir

    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    monkeypatch.setenv("KLOOP_LOCK_DIR", str(tmp_path / "link"))
    with pytest.raises(RuntimeError, match="not a directory of this user's"):
        host_lock_dir()
    monkeypatch.setenv("KLOOP_LOCK_DIR", str(tmp_path / "mine"))
    assert host_lock_dir() == tmp_path / "mine"


# ---- what the device lock covers in an evaluation ---------------------------------------------

def _observed(monkeypatch, lock_dir: Path):
    """Run evaluations with a real flock device lock (as on a GPU, here on CPU) and record, for
    every child that uses the device, when it said it was ready, when the lock was taken and
    given back, and whether the child was gone by then."""
    import contextlib
    import threading
    import time

    from kloop.evaluator.harness.state import EvalRun
    from kloop.evaluator.procs.devicelock import device_lock

    record: list[dict] = []
    spawn = EvalRun.spawn
    guard = threading.Lock()

    def observed_spawn(self, ledger, mode, *args, **kwargs):
        child = spawn(self, ledger, mode, *args, **kwargs)
        self._observed_child = child
        return child

    def observed_lock(self, kind="exclusive"):
        @contextlib.contextmanager
        def held():
            with device_lock("cuda:9", lock_dir, kind) as hold:
                child = self._observed_child
                entry = {"mode": child.mode, "ready_at": child.ready_at, "locked": time.monotonic(),
                         "shared": kind != "exclusive", "kind": kind}
                upgrade = hold.upgrade

                def upgraded():
                    waited = upgrade()
                    entry["alone_at"] = time.monotonic()
                    return waited
                hold.upgrade = upgraded
                try:
                    yield hold
                finally:
                    entry["released"] = time.monotonic()
                    entry["child_gone"] = child.proc.poll() is not None
                    with guard:
                        record.append(entry)
        return held()

    monkeypatch.setattr(EvalRun, "spawn", observed_spawn)
    monkeypatch.setattr(EvalRun, "gpu_lock", observed_lock)
    return record


def test_the_device_lock_is_taken_after_the_child_started_and_given_back_after_it_ended(
        monkeypatch, tmp_path):
    from eval_helpers import candidate, cpu_config

    from kloop.evaluator.harness.pipeline import evaluate

    record = _observed(monkeypatch, tmp_path / "locks")
    r = evaluate("L3/1", candidate("mlp_torch.py"), cpu_config(tmp_path / "cache"))
    assert r.status == "correct", r.error
    assert [e["mode"] for e in record] == ["reference", "candidate"]
    for e in record:
        # Started and imported before the lock: the process start never held the device.
        assert e["ready_at"] is not None and e["ready_at"] <= e["locked"], e
        # Nothing of the child's can touch the device after it; the reference worker alone
        # stays, parked, and serves only under the candidate's hold (paired timing).
        assert e["child_gone"] == (e["mode"] != "reference"), e
    assert r.paired is not None
    assert "device_wait" in r.stage_seconds


def test_two_evaluations_start_their_processes_while_the_other_holds_the_device(
        monkeypatch, tmp_path):
    from eval_helpers import candidate, cpu_config

    from kloop.evaluator.harness.pipeline import evaluate_many

    record = _observed(monkeypatch, tmp_path / "locks")
    results = evaluate_many([("L3/1", candidate("mlp_torch.py"))] * 2,
                            cpu_config(tmp_path / "cache"), max_workers=2)
    assert [r.status for r in results] == ["correct", "correct"]
    spans = sorted((e["locked"], e["released"]) for e in record)
    assert len(spans) == 4 and not _overlaps(spans), spans  # device work never overlaps
    # ...but some child got ready while another held the lock: starts ran beside device work.
    assert any(a["locked"] < b["ready_at"] < a["released"]
               for a in record for b in record if a is not b), record


def test_each_device_child_reports_how_long_it_held_the_device(tmp_path):
    """`<mode>_held` (lock taken -> child gone) covers the child's own stages, start-up and exit
    included; `<mode>_start` is the start before the lock; `first_trial` and `trial_<kind>`,
    `probes`, `trials_judged`, `trials_after` are parts of `correctness`: the breakdown
    bench/throughput.py prints."""
    sys.path.insert(0, str(Path(__file__).parent))
    from eval_helpers import candidate, cpu_config

    from kloop.evaluator.harness.pipeline import evaluate

    r = evaluate("L3/1", candidate("mlp_torch.py"), cpu_config(tmp_path / "c", baselines="eager"))
    s = r.stage_seconds
    assert r.status == "correct", r.error
    # Each figure is rounded to the millisecond (`outcome.fold`): a sum of rounded parts may
    # pass the rounded whole by half a millisecond per figure. Built ahead, nothing but the
    # stages themselves is left under the candidate's hold, so they can meet.
    ms = 0.0005
    assert s["reference_held"] >= s["ref_reference"] + s["ref_baselines"] - 3 * ms
    assert s["candidate_held"] >= s["load"] + s["correctness"] + s["timing"] - 4 * ms
    assert s["reference_start"] > 0 and s["candidate_start"] > 0
    assert 0 <= s["first_trial"] <= s["correctness"]
    # The correctness stage's parts: the child's time before each kind of trial and before it
    # asks to be timed, and the harness's own judging; they add up to no more than the stage.
    parts = ["trial_random", "trial_reparam", "trials_judged", "trials_after"]
    assert all(p in s for p in parts), s  # milliseconds at these sizes: present, maybe 0.0
    assert sum(s[p] for p in parts) + s.get("probes", 0.0) <= s["correctness"] + 6 * ms


def test_profiled_trials_come_back_as_flags_and_change_no_verdict(tmp_path):
    """`EvalConfig.profile_trials` (bench/experiment.py --profile-trials): each probe trial of
    the candidate child comes back as a flag with its wall and CPU time and its top entries;
    the verdict and the trials are those of the same evaluation without it."""
    sys.path.insert(0, str(Path(__file__).parent))
    from eval_helpers import candidate, cpu_config

    from kloop.evaluator.harness.pipeline import evaluate

    src = candidate("mlp_triton.py")
    plain = evaluate("L3/1", src, cpu_config(tmp_path / "a", baselines="eager"))
    profiled = evaluate("L3/1", src, cpu_config(tmp_path / "b", baselines="eager",
                                                profile_trials=True))
    assert plain.status == profiled.status == "correct", (plain.error, profiled.error)
    flags = [f for f in profiled.flags if f.startswith("profile trial ")]
    assert [f.split(":")[0] for f in flags] == [f"profile trial {t.trial}"
                                                for t in profiled.correctness], flags
    assert all(re.match(r"profile trial \d+: wall \d+\.\d+ s, cpu \d+\.\d+ s\n", f) and
               "cumulative" in f for f in flags), flags[0][:300]
    assert not any(f.startswith("profile trial ") for f in plain.flags)
    assert [t.passed for t in plain.correctness] == [t.passed for t in profiled.correctness]


def test_beside_kept_workers_reference_holds_are_shared_and_never_beside_a_candidates_timing(
        monkeypatch, tmp_path):
    """Where a kept worker times the baselines, each evaluation's reference worker only makes
    outputs and takes the device shared (`EvalConfig.reference_hold`); a candidate child's hold
    (`EvalConfig.candidate_hold: untimed_shared`) overlaps no other candidate's, no exclusive hold and no kept
    worker's start, and no hold at all from its first timed call (`alone_at`) to its end."""
    from eval_helpers import cpu_config

    _holds_of_three(monkeypatch, tmp_path, cpu_config(tmp_path / "cache", kept_baselines=1,
                                                      baselines="eager",
                                                      candidate_hold="untimed_shared"))


@pytest.mark.gpu
def test_on_a_gpu_outputs_only_workers_share_only_a_candidates_untimed_start(
        monkeypatch, tmp_path):
    """The same on a GPU, the default config (all three baselines, a kept worker per
    problem), three candidates of a small L3/1 at once: real reference workers beside real
    candidate trials, every timed call alone."""
    from eval_helpers import MLP_SMALL

    from kloop.evaluator.common.config import EvalConfig

    _holds_of_three(monkeypatch, tmp_path, EvalConfig(device="cuda", cache_dir=tmp_path / "cache",
                                                      problem_overrides=MLP_SMALL,
                                                      candidate_hold="untimed_shared"))


def _holds_of_three(monkeypatch, tmp_path, config) -> None:
    from eval_helpers import candidate

    from kloop.evaluator.harness.pipeline import evaluate_many
    from kloop.evaluator.harness.servers import SERVERS

    record = _observed(monkeypatch, tmp_path / "locks")
    try:
        results = evaluate_many([("L3/1", candidate("mlp_torch.py"))] * 3, config,
                                max_workers=3)
    finally:
        SERVERS.close_all()
    assert [r.status for r in results] == ["correct"] * 3, [r.error for r in results]
    own = [e for e in record if e["mode"] == "reference" and e["child_gone"]]
    assert len(own) == 3 and all(e["kind"] == "shared" for e in own), record
    cands = [e for e in record if e["mode"] == "candidate"]
    assert len(cands) == 3 and all(e["kind"] == "candidate" and "alone_at" in e
                                   for e in cands), cands
    assert all(r.stage_seconds.get("timing_alone_wait") is not None for r in results)

    def apart(a, b, since="locked"):
        return b["released"] <= a[since] or b["locked"] >= a["released"]
    for a in record:
        for b in record:
            if b is a:
                continue
            if a["kind"] == "exclusive" or (a["kind"] == "candidate" and b["kind"] != "shared"):
                assert apart(a, b), (a, b)
            if a["kind"] == "candidate":  # outputs-only workers beside its trials at most
                assert apart(a, b, "alone_at"), (a, b)
