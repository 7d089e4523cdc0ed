"""Static anti-cheat rules: each fires on a small bad snippet and stays silent on honest code."""

from __future__ import annotations

from pathlib import Path

import pytest

from kloop.evaluator.common import rules
from kloop.evaluator.harness.checks import RUNTIME_RULES, ast_rules
from kloop.evaluator.harness.static import RULES, static_violations

HERE = Path(__file__).parent
FIXTURES = HERE / "fixtures_e2"
CANDIDATES = Path(__file__).parent / "candidates"

BAD = {
    "frame_introspection": [
        "import inspect\n",
        "import sys\ndef f():\n    return sys._getframe(1).f_locals['expected']\n",
        "def f():\n    return globals()['__builtins__']\n",
        "def f():\n    return globals().get('__builtins__')\n",
        "def f(g):\n    return g(globals())\n",
        "NS = globals()\n",
        "import gc\nouts = [o for o in gc.get_objects()]\n",
        # Past the gc.collect allowance: the module as a value, or through a safe name.
        "import gc\nfind = getattr(gc, 'get_' + 'objects')\n",
        "import gc as g\nm = g\n",
        "import gc\nm = gc.collect.__self__\n",
        "from gc import get_referrers\n",
        "import sys\nharness = sys.modules['__main__']\n",
        "def f(exc):\n    return exc.__traceback__.tb_frame.f_back\n",
        # Past the Lock allowance through a method's globals (threading's own namespace).
        "import threading\nT = threading.Event().wait.__func__.__globals__['Thread']\n",
    ],
    "timing_or_comparison_tampering": [
        "import torch\ntorch.cuda.synchronize = lambda *a: None\n",
        "import torch\n_orig = torch.allclose\ntorch.allclose = lambda *a, **k: True\n",
        "import time\ntime.perf_counter = lambda: 0.0\n",
        "import torch.cuda as tc\ntc.Event.elapsed_time = lambda self, other: 0.001\n",
        "import torch\nsetattr(torch.testing, 'assert_close', lambda *a, **k: None)\n",
        "from torch import cuda\ndel cuda.Event\n",
        "from unittest import mock\n",
        "import torch\ntorch.cuda.__dict__['synchronize'] = print\n",
        "__builtins__['print'] = None\n",
    ],
    "threads_or_processes": [
        "import threading\nthreading.Thread(target=print).start()\n",
        # The cheapest way past the Lock allowance: a safe name's attributes lead to `_thread`.
        "import threading\nthreading.Lock.__self__.start_new_thread(print, ())\n",
        "import threading as t\nspawn = getattr(t, 'Thread')\n",
        "from threading import Lock, Timer\n",
        "import _thread\n",
        "from concurrent.futures import ThreadPoolExecutor\n",
        "import subprocess\n",
        "import torch.multiprocessing as mp\n",
        "import os\npid = os.fork()\n",
    ],
    "tensor_subclass": [
        "import torch\nclass Lazy(torch.Tensor):\n    pass\n",
        "import torch\nclass P:\n    @classmethod\n    def __torch_function__(cls, f, t, a=(), k=None):\n"
        "        return f(*a)\n",
        "import torch\ndef f(x):\n    return torch.Tensor._make_subclass(Fake, x)\n",
        "from torch.overrides import TorchFunctionMode\nclass M(TorchFunctionMode):\n    pass\n",
    ],
    "reference_model": [
        "class ModelNew(Model):\n    pass\n",
        "import torch\nclass ModelNew(torch.nn.Module):\n    def __init__(self, *a):\n"
        "        super().__init__()\n        self.ref = Model(*a)\n",
        "from problems.level3 import mlp\n",
        "from kloop.problems.level3 import mlp\n",
        "import kloop.evaluator.worker.serve as s\n",
    ],
    "identity_keyed_cache": [
        "_OUT = {}\ndef forward(x):\n    k = (x.shape, x.data_ptr())\n    if k not in _OUT:\n"
        "        _OUT[k] = x * 2\n    return _OUT[k]\n",
        "_CACHE = {}\ndef forward(x):\n    k = x.data_ptr()\n    if k in _CACHE:\n"
        "        return _CACHE[k]\n    _CACHE[k] = y = x * 2\n    return y\n",
        "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
        "        return self.memo.setdefault(id(x), x.relu())\n",
    ],
    "shape_keyed_cache": [
        "OUT = {}\ndef forward(x):\n    if x.shape in OUT:\n        return OUT[x.shape]\n"
        "    OUT[x.shape] = x\n    return x\n",
        "import functools\n@functools.lru_cache(maxsize=None)\ndef f(x):\n    return x * 2\n",
    ],
    "global_backend_flags": [
        "import torch\ntorch.backends.cuda.matmul.allow_tf32 = True\n",
        "import torch\nsetattr(torch.backends.cudnn, 'allow_tf32', True)\n",
        "import torch\ntorch.backends.cudnn.set_flags(True, True, 10, False, True)\n",
        # Scoped flags other than strict's own: the runtime probe (before/after) cannot see them.
        "import torch\ndef f(c, x):\n    with torch.backends.cudnn.flags(enabled=True):\n"
        "        return c(x)\n",
        "import torch\ndef f(c, x):\n    with torch.backends.cudnn.flags(enabled=True, "
        "allow_tf32=False, benchmark=True):\n        return c(x)\n",
        "import torch\nKW = dict(allow_tf32=True)\ndef f(c, x):\n"
        "    with torch.backends.cudnn.flags(**KW):\n        return c(x)\n",
        "import torch\ntorch.backends.cudnn.benchmark = True\n",
        "import torch\ntorch.set_float32_matmul_precision('high')\n",
        # Past the strict-settings allowance: only the literals False and "highest" pass.
        "import torch\ntorch.backends.cuda.matmul.allow_tf32 = 0\n",
        "import torch\nOFF = True\ntorch.backends.cudnn.allow_tf32 = OFF\n",
        "import torch\np = 'highest'\ntorch.set_float32_matmul_precision(p)\n",
        "import torch\ntorch.backends.cudnn.benchmark = False\n",
    ],
    "torch_compile_or_cuda_graph": [
        "import torch\nclass ModelNew(torch.nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n        self.f = torch.compile(self.g)\n",
        "import torch\n@torch.compile(mode='max-autotune')\ndef f(x):\n    return x\n",
        "import torch\ng = torch.cuda.CUDAGraph()\n",
        "import torch\ndef f(g):\n    with torch.cuda.graph(g):\n        pass\n",
    ],
    "dynamic_code": [
        "exec('import inspect')\n",
        # An unpickled global is an import no rule sees (`cthreading\nThread` ...).
        "import pickle\nThread = pickle.loads(PAYLOAD)\n",
        "m = __import__('ins' + 'pect')\n",
        "import importlib\nm = importlib.import_module('gc')\n",
    ],
}

HONEST = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl
from torch.utils.cpp_extension import load_inline

cuda_src = "__global__ void k(float* y) {}"
try:
    ext = load_inline(name="e", cpp_sources="", cuda_sources=cuda_src, functions=[])
except Exception as exc:  # a helpful message, then give up
    raise RuntimeError("build failed") from exc

_CONFIGS = {128: (64, 4), 256: (128, 8)}


def pick_config(n):
    return _CONFIGS.get(n, (64, 4))


class Helper:
    def noop(self):
        pass


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc = nn.Linear(d, d)
        self.bn = nn.BatchNorm1d(d)
        self.helper = Helper()
        self.sizes = {}

    def forward(self, x):
        y = torch.empty(x.shape, device=x.device, dtype=x.dtype)
        h = self.bn(self.fc(x)).contiguous()
        n = h.numel()
        block, warps = pick_config(n)
        self.sizes["last"] = n
        relu_kernel[(triton.cdiv(n, block),)](h, y, n, BLOCK=block, num_warps=warps)
        torch.cuda.synchronize()
        return y.view(x.shape[0], -1)
'''


def _rules(source: str, policy: str = "strict") -> set[str]:
    return {v.rule for v in static_violations(source, policy)}


@pytest.mark.parametrize("rule,snippet", [(r, s) for r, ss in BAD.items() for s in ss])
def test_rule_fires_on_bad_snippet(rule, snippet):
    violations = [v for v in static_violations(snippet) if v.rule == rule]
    assert violations, f"{rule} did not fire"
    v = violations[0]
    assert v.line is not None and v.line >= 1
    assert RULES[rule].rationale in v.message


def test_every_rule_has_a_bad_snippet_and_its_reason_reaches_the_model():
    """A model whose kernel is rejected reads why in its feedback: the rule's own rationale (each
    rule has one of its own), opening and close, beside the rule's name and line."""
    from kloop.agent.config import AgentConfig
    from kloop.agent.episode import EpisodeSpec, EpisodeState, feedback_template, feedback_vars
    from kloop.agent.prompts import PromptSet
    from kloop.evaluator.common.result import EvalResult
    from kloop.problems.registry import get_problem

    assert set(BAD) == set(RULES)
    reasons = [r.rationale for r in rules.RULES.values()]
    assert len(set(reasons)) == len(reasons), "two rules give the same reason"
    problem = get_problem("L3/1")
    for name, snippets in BAD.items():
        v = next(v for v in static_violations(snippets[0]) if v.rule == name)
        result = EvalResult(
            status="rejected", stage_reached="static", violations=[v], evaluator_version="t",
            problem_id=problem.id, problem_sha256=problem.sha256, candidate_sha256="c",
            policy="strict", device="cpu", backend="triton", started_at="t")
        state = EpisodeState(EpisodeSpec(problem=problem, key="k", episode=0, sample=0,
                                         max_turns=2))
        text = PromptSet().render(feedback_template(result),
                                  **feedback_vars(state, result, None, AgentConfig()))
        kind = "rule" if v.severity == "reject" else "note"
        line = next((ln for ln in text.splitlines() if ln.startswith(f"- {kind} `{name}` (line ")),
                    None)
        assert line is not None, (name, text)
        shown = text[text.index(line):]
        reason = RULES[name].rationale
        assert reason[:80] in shown and reason[-80:] in shown, (name, text)


# Honest candidates written for the evaluator-core tests (checked when present).
HONEST_CANDIDATES = ["mlp_triton.py", "lenet_triton.py", "relu_attention_triton.py",
                     "mlp_torch.py", "attention_cuda.py", "mlp_cuda_relu.py",
                     "resnet_block_bn_relu_cuda.py", "lenet_cuda_relu.py", "wrong_tile_triton.py",
                     "off_by_little.py"]


def test_honest_candidates_are_silent():
    assert static_violations(HONEST) == []
    paths = [*FIXTURES.glob("*.py"), *(CANDIDATES / n for n in HONEST_CANDIDATES)]
    for path in [p for p in paths if p.is_file()]:
        assert static_violations(path.read_text()) == [], path.name


def test_collecting_garbage_a_registry_in_globals_and_strict_settings_pass():
    """Three honest styles strict once rejected (H49-H51 run them end to end)."""
    for snippet in (
        "import gc\ndef pack(ws):\n    out = [w.t().contiguous() for w in ws]\n"
        "    gc.collect()\n    return out\n",
        "from gc import collect\ncollect()\n",
        "def kernel(name):\n    if f'_{name}_kernel' not in globals():\n        raise KeyError(name)\n"
        "    return globals()[f'_{name}_kernel']\n",
        "def register(fn):\n    globals().setdefault('_REGISTRY', {})\n    return fn\n",
        "import torch\ntorch.set_float32_matmul_precision('highest')\n"
        "torch.backends.cuda.matmul.allow_tf32 = False\ntorch.backends.cudnn.allow_tf32 = False\n",
        "import torch\ntorch.set_float32_matmul_precision(precision='highest')\n",
    ):
        assert static_violations(snippet) == [], snippet


def test_a_table_that_is_only_read_is_not_a_cache():
    snippet = ("BLOCK_FOR_K = {64: 32, 128: 64}\ndef pick(x):\n    k = x.shape[1]\n"
               "    return BLOCK_FOR_K.get(k, 16)\n")
    assert static_violations(snippet) == []
    configs = snippet + "def remember(x):\n    BLOCK_FOR_K[x.shape[1]] = 8\n"
    assert static_violations(configs) == []
    outputs = snippet + "def remember(x):\n    BLOCK_FOR_K[x.shape[1]] = x.relu()\n"
    assert {v.rule for v in static_violations(outputs)} == {"shape_keyed_cache"}


def test_severity_depends_on_policy():
    snippet = "import torch\ntorch.backends.cudnn.benchmark = True\nimport subprocess\n"
    strict = {v.rule: v.severity for v in static_violations(snippet, "strict")}
    kb = {v.rule: v.severity for v in static_violations(snippet, "kernelbench")}
    assert strict == {"global_backend_flags": "reject", "threads_or_processes": "reject"}
    assert kb == {"global_backend_flags": "flag", "threads_or_processes": "flag"}
    assert {v.severity for v in static_violations(BAD["shape_keyed_cache"][0])} == {"flag"}
    relaxed = static_violations(snippet, severities={"global_backend_flags": "flag"})
    assert {v.rule: v.severity for v in relaxed}["global_backend_flags"] == "flag"


def test_pipeline_adapter_and_deduplication():
    snippet = "import inspect, gc\n"
    found = ast_rules(snippet, "torch", "strict")
    assert [(v.rule, v.line) for v in found] == [("frame_introspection", 1)]


def test_local_rebinding_and_unrelated_attributes_do_not_fire():
    snippet = (
        "import time\nfrom torch import allclose\n"
        "allclose = None  # only this module's name\n"
        "class Cfg:\n    modules = []\n"
        "def f(self, x):\n    self.cache = {}\n    self.cache[x.shape] = x\n"
        "    t = time.perf_counter()\n    return t\n"
    )
    assert _rules(snippet) == {"shape_keyed_cache"}


# ---- false positives narrowed, and the cheapest attack past each narrowing ----------------

LOCKED_BLOCK_SIZE = """
import threading
import torch
_LOCK = threading.Lock()
_BLOCK = {}


def block_for(x):
    n = x.shape[-1]
    with _LOCK:
        if n not in _BLOCK:
            _BLOCK[n] = 128 if n >= 4096 else 64
        return _BLOCK[n]
"""

ALIGNMENT_TABLE = """
import torch
import triton
_CFG = {}


class ModelNew(torch.nn.Module):
    def forward(self, x):
        key = (tuple(x.shape), x.data_ptr() % 16 == 0)
        cfg = _CFG.get(key)
        if cfg is None:
            block = min(1024, triton.next_power_of_2(x.shape[-1]))
            warps = 4 if block <= 256 else 8
            cfg = (block, warps)
            _CFG[key] = cfg
        return cfg
"""

SCOPED_CUDNN = """
import torch


class ModelNew(torch.nn.Module):
    def forward(self, x):
        with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
            return self.conv(x)
"""


@pytest.mark.parametrize("source", [LOCKED_BLOCK_SIZE, ALIGNMENT_TABLE, SCOPED_CUDNN],
                         ids=["lock", "alignment_table", "scoped_cudnn"])
def test_honest_config_tables_locks_and_scoped_flags_raise_nothing(source):
    """A lock around a block-size table, an alignment-keyed launch-config cache and a scoped
    cuDNN flag change are what honest kernels do; none of them is a cache of outputs or a
    backend flag left set, so no static rule may fire on them."""
    assert static_violations(source, "strict") == []
    assert static_violations(source, "kernelbench") == []


def test_alignment_table_storing_a_tensor_is_still_a_cache():
    stores_output = ALIGNMENT_TABLE.replace("cfg = (block, warps)", "cfg = x * 2")
    assert _rules(stores_output) == {"shape_keyed_cache"}
    by_pointer = stores_output.replace("x.data_ptr() % 16 == 0", "x.data_ptr()")
    assert _rules(by_pointer) == {"identity_keyed_cache"}
    # A modulus too large to be an alignment is a pointer in disguise.
    disguised = stores_output.replace("% 16", "% (1 << 40)").replace("(1 << 40)", "1099511627776")
    assert _rules(disguised) == {"identity_keyed_cache"}


def test_attack_past_the_alignment_table_is_left_to_the_runtime():
    """The cheapest way past the narrowed cache rules: keep outputs in a list and store only a
    scalar index in the config table. Nothing static sees it; every checked call on fresh
    inputs does (exploit C4d: `incorrect` under strict), which is why the cache rules only
    flag."""
    source = (HERE / "../exploits/candidates/c04d_alignment_table_index.py").read_text()
    assert static_violations(source, "strict") == []
    assert RULES["identity_keyed_cache"].severity("strict") == "flag"
    assert RULES["shape_keyed_cache"].severity("strict") == "flag"


def test_attack_past_the_lock_allowance_is_caught_at_run_time_only():
    """Threads reached through another module (`queue.threading`) pass the static rule; the
    runtime thread count (`background_threads`, exploit T2b) is what catches them."""
    source = "import queue\nqueue.threading.Thread(target=print, daemon=True).start()\n"
    assert static_violations(source) == []
    assert RUNTIME_RULES["background_threads"].severity("strict") == "reject"


def test_attack_past_the_scoped_flags_allowance_is_an_open_hole():
    """A flag flipped inside the scope through a name the AST cannot resolve, and restored
    before return, is invisible to the static rule and to the before/after runtime probe. The
    allowance adds no hole: the same trick works without any scope (tests/exploits/README.md,
    open items)."""
    source = SCOPED_CUDNN.replace(
        "            return self.conv(x)",
        "            owner = self.owner\n            setattr(owner, 'benchmark', True)\n"
        "            return self.conv(x)")
    assert static_violations(source) == []


def test_one_rule_table():
    assert set(RULES) | set(RUNTIME_RULES) == set(rules.RULES)
    assert not set(RULES) & set(RUNTIME_RULES)
    for r in rules.RULES.values():
        assert {r.severity(p) for p in rules.POLICY_NAMES} <= {"reject", "flag"}
    strict = set(rules.rejected_by("strict"))
    assert {"threads_or_processes", "global_backend_flags", "input_mutation"} <= strict
    assert not {"identity_keyed_cache", "shape_keyed_cache"} & strict
    assert rules.rejected_by("kernelbench") == ["protocol_violation"]


CONFIG_HELPER = """
import torch
import triton
_CFG = {}


def config_for(x, n):
    key = (tuple(x.shape), x.data_ptr() % 16 == 0)
    if key not in _CFG:
        _CFG[key] = (min(128, triton.next_power_of_2(n)), 4)
    return _CFG[key]


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return config_for(x, x.shape[-1])
"""


def test_config_helper_parameters_are_judged_at_their_call_sites():
    assert static_violations(CONFIG_HELPER) == []
    # The same helper handed a tensor where the shape was: `min` passes the tensor through.
    tensor_arg = CONFIG_HELPER.replace("config_for(x, x.shape[-1])", "config_for(x, x.sum())")
    assert _rules(tensor_arg) == {"shape_keyed_cache"}
    never_called = CONFIG_HELPER.replace("return config_for(x, x.shape[-1])", "return x")
    assert _rules(never_called) == {"shape_keyed_cache"}


MEMO_HELPER = """
import functools
import torch
import triton


@functools.lru_cache(maxsize=None)
def launch_config(M, N):
    block_m = 16 if M <= 16 else 32
    return block_m, min(128, triton.next_power_of_2(N)), 4


class ModelNew(torch.nn.Module):
    def forward(self, x):
        M, N = x.shape
        bm, bn, warps = launch_config(int(M), N)
        return x.relu()
"""


def test_a_memoised_launch_config_helper_is_not_a_cache():
    """`lru_cache` on a function that returns only scalars made from the shapes its callers
    pass (H30) cannot return an output; each way of making it one keeps the flag."""
    assert static_violations(MEMO_HELPER) == []
    attacks = {
        "a tensor where a shape was": MEMO_HELPER.replace("launch_config(int(M), N)",
                                                          "launch_config(x.sum(), N)"),
        "an annotation does not make an int": MEMO_HELPER.replace(
            "def launch_config(M, N):", "def launch_config(M: int, N: int):").replace(
            "launch_config(int(M), N)", "launch_config(x, N)"),
        "handed on, called with anything": MEMO_HELPER + "\nALIAS = launch_config\n",
        "returns a tensor": MEMO_HELPER.replace("    return block_m,", "    return torch.ones(M),"),
        "unpacked from something that is not a shape": MEMO_HELPER.replace(
            "M, N = x.shape", "M, N = x.sum(0), x.shape[1]"),
        "never called": MEMO_HELPER.replace("        bm, bn, warps = launch_config(int(M), N)\n",
                                            ""),
        "takes *args": MEMO_HELPER.replace("def launch_config(M, N):",
                                           "def launch_config(M, N, *rest):"),
    }
    for why, src in attacks.items():
        assert _rules(src) == {"shape_keyed_cache"}, why


def test_names_unpacked_from_a_shape_are_scalars():
    table = """
import torch
import triton
_CFG = {}


class ModelNew(torch.nn.Module):
    def forward(self, x):
        M, N = x.shape
        if (M, N) not in _CFG:
            _CFG[(M, N)] = (min(128, triton.next_power_of_2(N)), 4)
        return x.relu()
"""
    assert static_violations(table) == []
    # What is stored is judged the same way: from a tensor's values, or a tensor, it flags.
    for stored in ("(int(x.sum()), 4)", "x.relu()"):
        src = table.replace("(min(128, triton.next_power_of_2(N)), 4)", stored)
        assert _rules(src) == {"shape_keyed_cache"}, stored


SM_COUNT = """
import functools
import torch


@functools.lru_cache(maxsize=None)
def sm_count(index):
    return torch.cuda.get_device_properties(index).multi_processor_count


class ModelNew(torch.nn.Module):
    def forward(self, x):
        programs = min(4 * sm_count(x.device.index), x.shape[0])
        return x.relu()
"""

RECORD = """
import dataclasses
import functools
import torch
import triton


@dataclasses.dataclass(frozen=True)
class Launch:
    block_t: int
    num_warps: int

    def grid(self, n):
        return (triton.cdiv(n, self.block_t),)


@functools.lru_cache(maxsize=None)
def launch_for(t):
    return Launch(block_t=triton.next_power_of_2(t), num_warps=4)


class ModelNew(torch.nn.Module):
    def forward(self, x):
        B, T = x.shape
        cfg = launch_for(T)
        return x.relu()
"""


def test_device_properties_and_frozen_records_of_scalars_are_launch_configs():
    """The SM count of the input's device, and a frozen dataclass (or NamedTuple) of ints built
    from shapes, memoised: launch configs, not outputs (helper-found false positives)."""
    assert static_violations(SM_COUNT) == []
    assert static_violations(RECORD) == []
    named = RECORD.replace("@dataclasses.dataclass(frozen=True)\nclass Launch:",
                           "class Launch(typing.NamedTuple):").replace(
        "import dataclasses", "import typing").replace(
        "    def grid(self, n):\n        return (triton.cdiv(n, self.block_t),)\n", "")
    assert static_violations(named) == []
    attacks = {
        "not frozen": RECORD.replace("(frozen=True)", ""),
        "a tensor field": RECORD.replace("    num_warps: int\n", "    num_warps: torch.Tensor\n"),
        "an int field whose default is a tensor": RECORD.replace(
            "    num_warps: int\n", "    num_warps: int = torch.zeros(2)\n").replace(
            ", num_warps=4)", ")"),
        "a class attribute that can hold anything": RECORD.replace(
            "    num_warps: int\n", "    num_warps: int\n    kept = {}\n"),
        "built from a tensor": RECORD.replace("cfg = launch_for(T)", "cfg = launch_for(x)"),
        "a second class of that name": RECORD + "\nclass Launch:\n    pass\n",
        "the name bound to something else": RECORD + "\nLaunch = dict\n",
        "a look-alike of get_device_properties": SM_COUNT.replace(
            "torch.cuda.get_device_properties(index)", "get_device_properties(index)").replace(
            "import torch\n", "import torch\nget_device_properties = dict\n", 1),
        "a property read off anything": SM_COUNT.replace(
            "torch.cuda.get_device_properties(index).multi_processor_count",
            "index.multi_processor_count").replace("x.device.index", "x"),
    }
    for why, src in attacks.items():
        assert _rules(src) == {"shape_keyed_cache"}, why


def test_names_a_case_pattern_captures_from_shapes_are_scalars():
    table = """
import torch
_C = {}


class ModelNew(torch.nn.Module):
    def forward(self, x):
        M, N = x.shape
        if (M, N) not in _C:
            match (M, N):
                case (m, n) if n < 64:
                    _C[(M, N)] = (max(16, n), 4)
                case (m, n):
                    _C[(M, N)] = (min(128, n), 8)
        return x.relu()
"""
    assert static_violations(table) == []
    # Captured from something that is not a shape, or after a star: what is stored may be
    # anything, and the shape-keyed table flags.
    for subject in ("(M, x)", "(x.sum(), N)"):
        src = table.replace("match (M, N):", f"match {subject}:").replace(
            "case (m, n) if n < 64:", "case (n, m) if m is not None:")
        assert _rules(src) == {"shape_keyed_cache"}, subject
    starred = table.replace("case (m, n) if n < 64:", "case (*m, n) if n is not None:")
    assert _rules(starred) == {"shape_keyed_cache"}
