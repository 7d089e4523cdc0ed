"""Fixtures for evaluator tests (helpers live in eval_helpers.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kloop-cache")


@pytest.fixture
def drop_box():
    """A directory any uid can write (pytest's own temp dirs are 0700): where a probe in a
    candidate, which may run as the sandbox's uid, leaves what it saw. Not under /tmp or
    /var/tmp where the harness is root: contained children see those read-only
    (`zygote.SHARED_SCRATCH`)."""
    import os
    import shutil
    import tempfile

    import eval_helpers

    from evaluator.worker.zygote import SHARED_SCRATCH

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
