"""Shared pytest setup: the `gpu` marker needs a CUDA device; `api` tests need --run-api; tests
that share an expensive fixture stay in one pytest-xdist worker. Fixtures more than one suite
uses: `drop_box`, and `pch_store` (a real precompiled-header store, built once per session)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

# Two pytest-xdist workers share CI's two cores. Torch's default of one intra-op thread per core
# in each would put four spinning OpenMP threads on two cores: a 1 s full-size LSTM forward in a
# test process read 30-56 s in a fresh-clone CI run (2026-12-05 at d2aa663). Evaluations' own
# children set their thread counts themselves (`EvalConfig.cpu_threads`).
torch.set_num_threads(1)


def pytest_addoption(parser):
    parser.addoption("--run-api", action="store_true", help="run tests that call real LLM APIs")


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


# Module- and session-scoped fixtures that cost a minute or more of CPU (evaluations, builds, a Ray
# cluster). pytest-xdist (`make test`: --dist loadgroup) sends every other test to any free
# worker, where such a fixture would be set up once per worker that runs one of its tests: the
# tests that take one are put in one xdist_group instead, so it is set up once per run.
# What the workers share and do not split: the host's temp dir, so sandbox uid leases and work
# dirs stay exclusive across them as across any two kloop processes on a host.
SHARED_FIXTURES = {
    "_pch_store_built",  # session: builds the PCH of torch's headers (pch_store)
    "honest",  # test_honest_candidates: every honest candidate evaluated
    "results",  # test_anticheat, test_broken_candidates: every case evaluated
    "runs",  # test_compile_triton: evaluations of Triton candidates
    "facts",  # test_lean_build: what torch's headers include
    "check_cache",  # test_compile_nvcc: a check cache the second check must hit
    "cluster",  # test_ray_executor: a three-node Ray cluster
    "paired_run",  # test_paired: two workers timed in paired rounds
}


def pytest_runtest_setup(item):
    """Under --dist loadgroup, xdist marks a grouped test's group in its node id, which is how its
    scheduler learns of it; a pytest that ignores that mark (9.2.0 with xdist 3.8) spreads the
    groups silently and sets up each shared fixture in every worker: fail such tests instead."""
    if getattr(item.config.option, "loadgroup", False) and \
            item.get_closest_marker("xdist_group") and "@" not in item.nodeid:
        pytest.fail("pytest-xdist lost this test's xdist_group under this pytest "
                    f"{pytest.__version__}: install one that the dev extra allows", pytrace=False)


def _xdist_group(item) -> str | None:
    info = getattr(item, "_fixtureinfo", None)
    for name in sorted(SHARED_FIXTURES & set(getattr(item, "fixturenames", ()))):
        defs = info.name2fixturedefs.get(name) if info is not None else None
        if defs and defs[-1].scope == "session":
            return name
        return f"{item.module.__name__}.{name}"
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook, which reads the groups
def pytest_collection_modifyitems(config, items):
    for item in items:
        group = _xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    # Ray's address `auto` connects to any cluster it finds on the host, so a test that needs
    # none runs in the cluster tests' worker, where the cluster is up only during their module.
    cluster = next((_xdist_group(i) for i in items if "cluster" in getattr(i, "fixturenames", ())
                    and i.module.__name__.endswith("test_ray_executor")), None)
    for item in items:
        if cluster is not None and item.get_closest_marker("no_ray_cluster"):
            item.add_marker(pytest.mark.xdist_group(cluster))
    # The longest work first (tests marked slow, and the groups, each of which one worker runs
    # whole): xdist hands out work in collection order, and a minute-long build or cluster left to
    # the end runs on one worker while the other has nothing left (the suite's tail on CI's 2
    # cores). A stable sort: within each class the order is pytest's.
    items.sort(key=lambda i: not (i.get_closest_marker("slow") or i.get_closest_marker("xdist_group")))
    has_cuda = _has_cuda()
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device (run `make test-gpu` on a GPU machine)")
    skip_api = pytest.mark.skip(reason="calls a real LLM API; pass --run-api")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
        if "api" in item.keywords and not config.getoption("--run-api"):
            item.add_marker(skip_api)


@pytest.fixture
def drop_box():
    """A directory any uid can write (pytest's own temp dirs are 0700): where a probe in a
    candidate, which may run as the sandbox's uid, leaves what it saw. Not under /tmp or
    /var/tmp where the harness is root: contained children see those read-only
    (`zygote.SHARED_SCRATCH`). Needs tests/evaluator on sys.path (for eval_helpers), as it is
    for the modules there; a module elsewhere puts it there itself."""
    import os
    import shutil
    import tempfile

    import eval_helpers

    from kloop.evaluator.worker.zygote import SHARED_SCRATCH

    top = None
    if os.geteuid() == 0:
        top = next((d for d in ("/var/lib", "/opt", "/") if os.path.isdir(d)
                    and not any(d == s or d.startswith(s + "/") for s in SHARED_SCRATCH)), None)
    drop = Path(tempfile.mkdtemp(prefix="kloop-drop-", dir=top))
    drop.chmod(0o777)
    # Where the tree is read-only for children (root without capabilities), `cpu_config`
    # lets them write here (`EvalConfig.child_writable`).
    eval_helpers.DROP_BOXES.append(str(drop))
    yield drop
    eval_helpers.DROP_BOXES.remove(str(drop))
    shutil.rmtree(drop, ignore_errors=True)


# ---- a real PCH store (one build per session, ~50 s on a 2-core host) -----------------------


@pytest.fixture(scope="session")
def _pch_store_built():
    """A store as the harness makes it (vault-owned under root), somewhere sandbox uids can
    reach, with the PCH of `Variant(False, ("-O3",))` built by the trusted builder. Its
    directory is `KLOOP_PCH_DIR` only while it is built and while a test that takes
    `pch_store` runs, not for the rest of the session."""
    import shutil
    import tempfile

    from kloop.evaluator.build import pch

    base = Path(tempfile.mkdtemp(prefix="kloop-pch-test-"))
    base.chmod(0o755)
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(pch.DIR_ENV, str(base / "store"))
            root = pch.store_dir()
            assert root is not None
            key = pch.build(root, pch.Variant(False, ("-O3",)))
            assert key is not None, "the trusted builder made no PCH"
        yield root, key
    finally:
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def pch_store(_pch_store_built, monkeypatch):
    """(root, key) of the session's PCH store, which is the harness's store for this test."""
    from kloop.evaluator.build import pch

    root, key = _pch_store_built
    monkeypatch.setenv(pch.DIR_ENV, str(root))
    # The compile check's PCH is made in the background by the first CUDA check of a process
    # without a GPU, into whatever store is the harness's then: not into this one, whose tests
    # compare its contents before and after a candidate's build.
    started = threading.Event()
    started.set()
    monkeypatch.setattr(pch, "_check_started", started)
    return root, key


@pytest.fixture
def no_kept_workers():
    """No kept baseline worker (`evaluator.harness.servers`) before or after the test: each
    test counts the ones it starts."""
    from kloop.evaluator.harness.servers import SERVERS

    SERVERS.close_all()
    yield SERVERS
    SERVERS.close_all()


@pytest.fixture
def tight_budget(monkeypatch):
    """A policy (`budget_test`) whose device-time budget every call exceeds: once a problem's
    eager time is known, each side gets the floor, 4 timed calls (`evaluator.harness.budget`).
    No estimate stands before or after the test."""
    from kloop.evaluator.common.config import POLICIES
    from kloop.evaluator.harness import budget

    p = POLICIES["strict"].model_copy(update={"name": "budget_test", "timing_budget_ms": 1e-6,
                                              "timing_min_trials": 4,
                                              "timing_stop_width": None})
    monkeypatch.setitem(POLICIES, p.name, p)
    budget.forget_all()
    yield p
    budget.forget_all()


# KLOOP_TEST_TIMELINE=FILE: each test's worker, start and end appended to FILE, to see where a
# run's cores sit idle (scripts/test_timeline.py reads it).
_TIMELINE = __import__("os").environ.get("KLOOP_TEST_TIMELINE")
_started_at: dict[str, float] = {}


def pytest_runtest_logstart(nodeid, location):
    if _TIMELINE:
        import time

        _started_at[nodeid] = time.time()


def pytest_runtest_logfinish(nodeid, location):
    if _TIMELINE and nodeid in _started_at:
        import json
        import os
        import time

        with open(_TIMELINE, "a") as f:
            f.write(json.dumps({"worker": os.environ.get("PYTEST_XDIST_WORKER", "main"),
                                "test": nodeid, "start": _started_at.pop(nodeid),
                                "end": time.time()}) + "\n")
