"""Backend detection and custom-kernel names, from the syntax tree of candidate sources."""

from __future__ import annotations

from pathlib import Path

import pytest
from kloop.evaluator.common.backend import cuda_kernel_names, custom_kernel_names, detect_backend

FIXTURES = Path(__file__).parent / "fixtures_e2"


def fixture(name: str) -> str:
    return (FIXTURES / name).read_text()


def test_fixture_candidates_are_classified():
    assert detect_backend(fixture("cuda_add_ok.py")) == "cuda"
    assert detect_backend(fixture("triton_scale_ok.py")) == "triton"
    assert custom_kernel_names(fixture("cuda_add_ok.py")) == {"add_kernel"}
    assert custom_kernel_names(fixture("triton_scale_ok.py")) == {"_twice", "scale_relu_kernel"}


@pytest.mark.parametrize(
    "source",
    [
        # module alias and keyword
        "import torch.utils.cpp_extension as ce\nm = ce.load_inline('e', cpp_sources='', "
        "cuda_sources=SRC)\n",
        # full dotted path, positional cuda sources
        "import torch\nm = torch.utils.cpp_extension.load_inline('e', CPP, CUDA)\n",
        # function alias
        "from torch.utils.cpp_extension import load_inline as build\n"
        "m = build(name='e', cpp_sources=CPP, cuda_sources=[CUDA])\n",
        # file-based load
        "from torch.utils import cpp_extension\nm = cpp_extension.load('e', ['k.cu'])\n",
        # a try/except around the build changes nothing
        "from torch.utils.cpp_extension import load_inline\ntry:\n"
        "    m = load_inline('e', cpp_sources=C, cuda_sources=U)\nexcept Exception:\n    m = None\n",
    ],
)
def test_cuda_loaders(source):
    assert detect_backend(source) == "cuda"


@pytest.mark.parametrize(
    "source",
    [
        "from triton import jit\n@jit\ndef k(x):\n    pass\n",
        "import triton as t\n@t.autotune(configs=[], key=[])\n@t.jit\ndef k(x):\n    pass\n",
        "import triton\n@triton.heuristics({'B': lambda a: 4})\n@triton.jit\ndef k(x):\n    pass\n",
        "import triton\ndef k(x):\n    pass\nk = triton.jit(k)\n",
    ],
)
def test_triton_decorators(source):
    assert detect_backend(source) == "triton"
    assert "k" in custom_kernel_names(source)


@pytest.mark.parametrize(
    "source",
    [
        "import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
        "        return x.relu()\n",
        # a CPU-only C++ extension is not a GPU kernel
        "from torch.utils.cpp_extension import load_inline\nm = load_inline('e', cpp_sources=C)\n",
        "from torch.utils.cpp_extension import load_inline\n"
        "m = load_inline('e', cpp_sources=C, cuda_sources=None)\n",
        # a `jit` that is not Triton's, and a `load` that is not torch's
        "import torch\n@torch.jit.script\ndef f(x):\n    return x\nimport json\nj = json.load(F)\n",
        # the word in a string or comment is not a call
        "s = 'load_inline(cuda_sources=...) and @triton.jit'  # triton.jit\n",
    ],
)
def test_plain_torch(source):
    assert detect_backend(source) == "torch"


def test_mixed_candidate_is_cuda():
    src = (
        "import triton\nfrom torch.utils.cpp_extension import load_inline\n"
        "@triton.jit\ndef tk(x):\n    pass\nm = load_inline('e', cpp_sources=C, cuda_sources=U)\n"
    )
    assert detect_backend(src) == "cuda"


def test_cuda_kernel_names_handle_real_declarations():
    cuda = """
    // __global__ void commented_out(int x)
    /* __global__ void also_commented(int x) */
    template <typename scalar_t, int BLOCK>
    __global__ void __launch_bounds__(256, 2) fused_kernel(const scalar_t* __restrict__ x) {}
    extern "C" __global__ void plain_c_kernel(float* y) {}
    __global__
    void
    split_line_kernel(float* y) {}
    __device__ float helper(float v) { return v; }
    static __global__ void static_kernel() {}
    """
    assert cuda_kernel_names(cuda) == {
        "fused_kernel", "plain_c_kernel", "split_line_kernel", "static_kernel",
    }


def test_syntax_error_is_raised_not_guessed():
    with pytest.raises(SyntaxError):
        detect_backend("def broken(:\n")
