"""Isolation: a crash does not leak into the next candidate, the memory watchdog, policies, the
harness's /proc files, processes that escape their group."""

from __future__ import annotations

import json
import os
import secrets
import time

from eval_helpers import candidate, cpu_config
from kloop.evaluator.harness.pipeline import evaluate
from kloop.evaluator.procs import isolation


def test_next_candidate_after_a_crash_runs_fine(cache_dir):
    config = cpu_config(cache_dir)
    crashed = evaluate("L3/1", candidate("segfault.py"), config)
    after = evaluate("L3/1", candidate("mlp_torch.py"), config)
    assert crashed.status == "runtime_error" and crashed.error.type == "SIGSEGV"
    assert after.status == "correct", after.error


def test_host_memory_watchdog_kills_a_growing_process(cache_dir):
    # No address-space limit here, so only the harness's RSS watchdog can stop it.
    config = cpu_config(cache_dir, cpu_memory_limit_gb=1024.0, host_rss_limit_gb=1.5)
    r = evaluate("L3/1", candidate("memory_hog.py"), config)
    assert r.status == "runtime_error"
    assert r.error.type == "MemoryLimit"
    assert r.stage_reached == "correctness"


def test_kernelbench_policy_only_flags_input_mutation(cache_dir):
    r = evaluate("L3/1", candidate("mutates_input.py"), cpu_config(cache_dir, policy="kernelbench"))
    assert (r.status, r.policy) == ("correct", "kernelbench")
    assert [(v.rule, v.severity) for v in r.violations] == [("input_mutation", "flag")]
    assert "input_mutation" in r.flags
    # KernelBench checks no output after timing.
    assert [t.kind for t in r.correctness] == ["random"] * 5


def test_candidate_cannot_read_the_harness_proc_files(cache_dir, monkeypatch):
    secret = secrets.token_hex(12)
    monkeypatch.setenv("KLOOP_TEST_SECRET", secret)
    r = evaluate("L3/1", candidate("proc_spy.py"), cpu_config(cache_dir))
    assert r.status == "runtime_error", r.error
    found = json.loads(r.error.message.split("FOUND ", 1)[1])
    assert secret not in r.error.message
    assert found["environ"].startswith("denied") and found["maps"].startswith("denied")
    assert "mem" not in found or found["mem"] == [] or found["mem"].startswith("denied")
    assert isolation.harness_dumpable() is False
    # Under another uid, or as root without capabilities: never with the harness's powers.
    assert ("isolation_same_uid" in r.flags) == (os.geteuid() != 0 or not _sandbox_uid_works())


def test_escaped_sleeper_is_killed_when_the_evaluation_ends(cache_dir, drop_box):
    pid_file = drop_box / "sleeper.pid"  # the sandbox uid writes the sleeper's pid here
    sleep_s = f"600.{os.getpid()}"
    source = candidate("escapes_group.py").replace("{pid_file}", str(pid_file)).replace(
        "{sleep_s}", sleep_s)
    r = evaluate("L3/1", source, cpu_config(cache_dir))
    assert r.status == "correct", r.error
    assert pid_file.read_text().strip().isdigit()  # it ran
    time.sleep(0.2)
    assert _sleepers(sleep_s) == []


def _sleepers(sleep_s: str) -> list[int]:
    """Host pids of `sleep SLEEP_S` processes."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if f.read().split(b"\0")[:2] == [b"sleep", sleep_s.encode()]:
                        found.append(int(entry))
            except OSError:
                pass
    return found


def _sandbox_uid_works() -> bool:
    from kloop.problems.registry import get_problem

    plan = isolation.plan_sandbox(65534, False, get_problem("L3/1").path)
    return plan.uid is not None


def test_candidate_runs_under_the_planned_identity(cache_dir):
    from kloop.problems.registry import get_problem

    config = cpu_config(cache_dir)
    plan = isolation.plan_sandbox(config.sandbox_uid, False, get_problem("L3/1").path)
    r = evaluate("L3/1", candidate("whoami.py"), config)
    ident = dict(kv.split("=") for kv in r.error.message.split("IDENTITY ", 1)[1].split())
    assert ident["nnp"] == "1"
    if plan.uid is not None:
        assert (int(ident["uid"]), int(ident["gid"])) == (plan.uid, plan.gid)
        assert "isolation_same_uid" not in r.flags
    else:
        assert int(ident["uid"]) == os.geteuid() and "isolation_same_uid" in r.flags
    if plan.uid is not None or plan.drop_caps:
        assert int(ident["cap"], 16) == 0


def test_a_child_that_fills_the_shared_disk_is_killed(cache_dir):
    """The evaluation's dir is on the disk every other evaluation builds and writes on: past
    `disk_limit_gb` the child is killed (a runtime error that says so) and its files go."""
    filler = candidate("disk_filler.py")
    r = evaluate("L3/1", filler, cpu_config(cache_dir, disk_limit_gb=0.25))
    assert r.status == "runtime_error", (r.status, r.error)
    assert r.error.type == "DiskLimit" and "0.25 GiB" in r.error.message, r.error
    r = evaluate("L3/1", filler, cpu_config(cache_dir, disk_limit_gb=4))
    assert r.status == "correct", r.error  # 1 GiB of honest-looking scratch is within the limit


def test_the_disk_limit_counts_files_too(tmp_path):
    """Empty files take inodes, not space: a tree of too many entries is over the limit even
    though the free space hardly moved (tmpfs and most filesystems count inodes)."""
    from kloop.evaluator.procs.sandbox import DiskLimit

    limit = DiskLimit(tmp_path, limit=1 << 40, max_files=200)
    assert not limit.exceeded()
    for i in range(400):
        (tmp_path / f"f{i}").touch()
    assert limit.exceeded()
