"""Helpers for evaluator tests: candidate files, small problem sizes, CPU configs."""

from __future__ import annotations

import contextlib
import textwrap
from collections.abc import Iterator
from pathlib import Path

from kloop.evaluator.common.config import EvalConfig, StageTimeouts

CANDIDATES = Path(__file__).parent / "candidates"

# Problem sizes small enough for the Triton interpreter on a 2-core CI machine.
MLP_SMALL = {"batch_size": 2, "input_size": 64, "layer_sizes": [32, 32], "output_size": 128}
LENET_SMALL = {"batch_size": 2}
RELU_ATTENTION_SMALL = {"batch_size": 2, "max_seqlen": 16, "n_embd": 64, "n_head": 4}


def candidate(name: str) -> str:
    return (CANDIDATES / name).read_text()


def light_cuda_candidate() -> str:
    """`mlp_cuda_relu.py` without its `.cu`'s own `#include <torch/extension.h>`: the kernel and
    its host function need only the `<torch/types.h>` that `load_inline` puts before every CUDA
    source, so the CPU compile check parses torch's types header alone (a test that needs a CUDA
    candidate only for its compile child took 24-27 s with the include, 8-12 s without it, one
    at a time on the 2-core host, 2026-12-05)."""
    text = candidate("mlp_cuda_relu.py")
    light = text.replace('cuda_source = r"""\n#include <torch/extension.h>\n', 'cuda_source = r"""\n', 1)
    assert light != text, "mlp_cuda_relu.py no longer starts its .cu with the include"
    return light


def drop_rows(log: Path) -> list[dict]:
    """The JSON lines probes left at `log.<suffix>` (one file per writer: a file another uid
    made is not ours to append to, and contained children are all pid 1)."""
    import json

    return [json.loads(line) for f in log.parent.glob(f"{log.name}.*")
            for line in f.read_text().splitlines() if line.strip()]


DROP_BOXES: list[str] = []
"""The drop boxes of the running test (`conftest.drop_box`), writable for its children."""


def cpu_config(cache_dir: Path, **overrides) -> EvalConfig:
    """A CPU config with short limits; baselines, profiling and AOT checks off unless asked."""
    fields = dict(
        device="cpu", cache_dir=cache_dir, triton_aot=False, profile=False, baselines="none",
        cpu_timing_trials=2, problem_overrides=MLP_SMALL,
        timeouts=StageTimeouts(startup=180, load=120, correctness=15, timing=120, profile=120,
                               compile=300, reference=180, baselines=300),
    )
    fields.update(overrides)
    fields.setdefault("child_writable", list(DROP_BOXES))
    return EvalConfig(**fields)


@contextlib.contextmanager
def plain_start() -> Iterator[None]:
    """Within the block, children of this process start as fresh interpreters, as where the
    template process cannot be used (not Linux, no subreaper): templates of their own that find
    it unusable, so the ones already running are left as they are."""
    from kloop.evaluator.procs import forkserver

    saved = forkserver._SERVERS, forkserver.usable
    forkserver._SERVERS = {k: forkserver.ForkServer(interpret=k) for k in (False, True)}
    forkserver.usable = lambda: False
    try:
        yield
    finally:
        forkserver._SERVERS, forkserver.usable = saved


# A reference that runs eagerly but that torch.compile cannot trace (in either mode): its
# compiled baselines fail on their first call.
UNCOMPILABLE = textwrap.dedent('''\
    import torch
    import torch.nn as nn


    # An op whose tracing (fake) implementation raises: eager runs it, torch.compile cannot.
    @torch.library.custom_op(f"kloop_test::plus_one_{__name__}", mutates_args=())
    def plus_one(x: torch.Tensor) -> torch.Tensor:
        return x + 1


    @plus_one.register_fake
    def _(x):
        raise RuntimeError("this op cannot be traced")


    class Model(nn.Module):
        def __init__(self, width):
            super().__init__()
            self.fc = nn.Linear(width, width)

        def forward(self, x):
            return plus_one(self.fc(x))


    width = 8


    def get_inputs():
        return [torch.randn(2, width)]


    def get_init_inputs():
        return [width]
''')
