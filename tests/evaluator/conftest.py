"""Fixtures for evaluator tests (helpers live in eval_helpers.py; `drop_box` and `pch_store`,
which tests/exploits uses too, in tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def cache_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("kloop-cache")

