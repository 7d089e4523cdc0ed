"""Shared pytest setup: the `gpu` marker needs a CUDA device; `api` tests need --run-api."""

import pytest


def pytest_addoption(parser):
    parser.addoption("--run-api", action="store_true", help="run tests that call real LLM APIs")


def _has_cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    has_cuda = _has_cuda()
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device (run `make test-gpu` on a GPU machine)")
    skip_api = pytest.mark.skip(reason="calls a real LLM API; pass --run-api")
    for item in items:
        if "gpu" in item.keywords and not has_cuda:
            item.add_marker(skip_gpu)
        if "api" in item.keywords and not config.getoption("--run-api"):
            item.add_marker(skip_api)
