"""The torch form of a `.cu` split into a device half and a host half
(`evaluator.build.torch_form`): what each half holds, that every line stays where it was, and
what is refused (then the file is built the plain way). Text only; the build is in
test_torch_form_build.py."""

from __future__ import annotations

import re

import pytest

from kloop.evaluator.build import torch_form as tf

RELU = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

#define THREADS 256
#define CHECK_CUDA(x) TORCH_CHECK(x.is_cuda(), #x " must be CUDA")

struct Shape { long n; };
static const float kSlope = 0.0f;

__device__ __forceinline__ float relu1(float v) { return v > kSlope ? v : kSlope; }

__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y,
                            Shape s) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;  // "<<<" in a comment: text only
    if (i < s.n) y[i] = relu1(x[i]);
}

torch::Tensor relu_forward(torch::Tensor x) {
    CHECK_CUDA(x);
    auto y = torch::empty_like(x);
    Shape s{x.numel()};
    relu_kernel<<<(s.n + THREADS - 1) / THREADS, THREADS, 0,
                  at::cuda::getCurrentCUDAStream()>>>(
        x.data_ptr<float>(),
        y.data_ptr<float>(), s);
    return y;  // "__global__" in a string is text: "__global__"
}
"""


def _lines(text: str, word: str) -> list[int]:
    return [n for n, line in enumerate(text.split("\n"), 1) if word in line]


def test_each_half_holds_its_own_parts_at_their_own_lines():
    s = tf.split(RELU)
    assert s.launched == ["relu_kernel"]
    assert s.torch_includes == ["#include <torch/extension.h>"]
    # Every line stays where it was in both halves (diagnostics point into the original).
    assert RELU.count("\n") == s.device.count("\n") == s.host.count("\n")
    # The device half: kernels, device functions, shared declarations; no torch at all.
    assert "torch" not in re.sub(r"//.*", "", s.device)
    assert "TORCH_CHECK" not in s.device and "#include <cuda_runtime.h>" in s.device
    assert _lines(s.device, "__global__ void relu_kernel") == _lines(RELU, "__global__ void")
    assert _lines(s.device, "struct Shape") == _lines(RELU, "struct Shape")
    assert "relu1(float v)" in s.device
    # Its launcher sits on the kernel's closing line and launches with the launch's config.
    (closing,) = [ln for ln in s.device.split("\n") if "kloop_launch_relu_kernel" in ln]
    assert closing.startswith("}") and "relu_kernel<<<kloop_g, kloop_b, kloop_s, kloop_t>>>" \
        "(x, y, s);" in closing
    assert "Shape s)" in closing and "const float* __restrict__ x" in closing
    # The host half: no kernel, no device function, each launch a call of the launcher.
    assert "__global__" not in re.sub(r'"[^"]*"', "", s.host)
    assert "relu1" not in s.host and "threadIdx" not in s.host and "<<<" not in \
        re.sub(r"//.*", "", s.host)
    assert _lines(s.host, "torch::Tensor relu_forward") == _lines(RELU, "torch::Tensor relu_forward")
    assert _lines(s.host, "return y;") == _lines(RELU, "return y;")
    call = s.host[s.host.index("kloop_launch_relu_kernel((s.n"):]
    assert call.startswith("kloop_launch_relu_kernel((s.n + THREADS - 1) / THREADS,  THREADS,  0,")
    assert "at::cuda::getCurrentCUDAStream()" in call.split(";")[0]
    assert "x.data_ptr<float>()" in call.split(";")[0]
    # The launcher's prototype is where the kernel was, after the types it names.
    assert s.host.index("void kloop_launch_relu_kernel(") > s.host.index("struct Shape")
    assert _lines(s.host, "#define CHECK_CUDA") == _lines(RELU, "#define CHECK_CUDA")
    assert "#define CHECK_CUDA" not in s.device


def test_a_missing_shared_size_and_stream_launch_as_zero():
    text = ("#include <torch/extension.h>\n__global__ void k(float* p) { p[0] = 1; }\n"
            "void f(torch::Tensor t) { k<<<1, 32>>>(t.data_ptr<float>()); }\n")
    s = tf.split(text)
    assert "kloop_launch_k(1,  32, 0, 0,t.data_ptr<float>());" in s.host


def test_kernels_in_a_namespace_get_their_launcher_there():
    text = ("#include <torch/extension.h>\nnamespace ops {\n"
            "__global__ void k(float* p, int n) { if (n) p[0] = 1; }\n}\n"
            "void f(torch::Tensor t) { ops::k<<<1, 32>>>(t.data_ptr<float>(), 3); }\n")
    s = tf.split(text)
    assert "ops::kloop_launch_k(1,  32, 0, 0,t.data_ptr<float>(), 3);" in s.host
    dev_lines = s.device.split("\n")
    assert "kloop_launch_k" in dev_lines[2] and dev_lines[3].strip() == "}"


@pytest.mark.parametrize("body, why", [
    ("template <typename T> __global__ void k(T* p) { p[0] = 1; }\n"
     "void f(torch::Tensor t) { k<float><<<1, 1>>>(t.data_ptr<float>()); }\n", "template"),
    ("template <typename T> __global__ void k(T* p) { p[0] = 1; }\n"
     "void f(torch::Tensor t) { AT_DISPATCH_FLOATING_TYPES(t.scalar_type(), \"f\", [&] {\n"
     "  k<scalar_t><<<1, 1>>>(t.data_ptr<scalar_t>()); }); }\n", "template"),
    ("__global__ void k(float* p) { p[0] = 1; }\n"
     "void f(torch::Tensor t) { cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,"
     " 1 << 16); k<<<1, 1>>>(t.data_ptr<float>()); }\n", "outside a launch"),
    ("__constant__ float w[4];\n__global__ void k(float* p) { p[0] = w[0]; }\n"
     "void f(torch::Tensor t, torch::Tensor c) { cudaMemcpyToSymbol(w, c.data_ptr<float>(), 16);"
     " k<<<1, 1>>>(t.data_ptr<float>()); }\n", "outside a launch"),
    ("#ifdef FAST\n__global__ void k(float* p) { p[0] = 1; }\n#endif\n", "conditional"),
    ("int calls = 0;\n", "external linkage"),
    ("__host__ __device__ float sq(float v) { return v * v; }\n", "not inline"),
    ("__global__ void k(float* p, int n = 3) { p[0] = n; }\n"
     "void f(torch::Tensor t) { k<<<1, 1>>>(t.data_ptr<float>()); }\n", "default"),
    ("__global__ void k(float*) { }\n"
     "void f(torch::Tensor t) { k<<<1, 1>>>(t.data_ptr<float>()); }\n", "without a name"),
    ('const char* s = R"(x)";\n', "raw string"),
    ("namespace {\n__global__ void k(float* p) { p[0] = 1; }\n}\n", "anonymous"),
    ("void f(torch::Tensor t) { other<<<1, 1>>>(t.data_ptr<float>()); }\n", "not a kernel"),
])
def test_what_cannot_be_placed_for_certain_is_refused(body, why):
    with pytest.raises(tf.Refused, match=why):
        tf.split("#include <torch/extension.h>\n" + body)


def test_a_file_without_the_torch_header_is_not_the_torch_form():
    with pytest.raises(tf.Refused, match="does not include"):
        tf.split("#include <ATen/ATen.h>\n__global__ void k(float* p) { p[0] = 1; }\n")


def test_inline_host_device_helpers_go_to_both_halves():
    text = ("#include <torch/extension.h>\n"
            "__host__ __device__ inline int cdiv(int a, int b) { return (a + b - 1) / b; }\n"
            "__global__ void k(float* p, int n) { if (threadIdx.x < n) p[0] = 1; }\n"
            "void f(torch::Tensor t) { int n = t.numel();\n"
            "  k<<<cdiv(n, 256), 256>>>(t.data_ptr<float>(), n); }\n")
    s = tf.split(text)
    assert "inline int cdiv" in s.device and "inline int cdiv" in s.host
    assert "kloop_launch_k(cdiv(n, 256),  256, 0, 0,t.data_ptr<float>(), n)" in s.host


UNUSUAL = r"""
#include <torch/extension.h>
#include <cuda_fp16.h>

#define BLOCK 128
__host__ __device__ inline int cdiv(int a, int b) { return (a + b - 1) / b; }
typedef float4 vec4;
namespace ops {
struct Params { int n; float alpha; };
__device__ float act(float v, float a) { return v > 0 ? v : a * v; }
__global__ void __launch_bounds__(BLOCK) leaky(const float* __restrict__ x, float* y, Params p) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < p.n) y[i] = act(x[i], p.alpha);
}
__global__ void halve(const __half* x, __half* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = __hmul(x[i], __float2half(0.5f));
}
}  // namespace ops

torch::Tensor halve_forward(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int n = x.numel();
    ops::halve<<<cdiv(n, 256), 256, 0, (cudaStream_t)0>>>(
        reinterpret_cast<const __half*>(x.data_ptr<at::Half>()),
        reinterpret_cast<__half*>(y.data_ptr<at::Half>()), n);
    return y;
}
"""


def test_an_unusual_honest_file_is_split_and_only_what_it_launches_gets_a_launcher():
    """Namespaced kernels with `__launch_bounds__`, half-precision parameters, a device
    function, an inline host-device helper and a cast in the launch (it built, and its object
    defined both launchers and host functions, on the CPU host: 2026-12-05)."""
    s = tf.split(UNUSUAL)
    assert s.launched == ["halve"]
    assert "ops::kloop_launch_halve(cdiv(n, 256),  256,  0,  (cudaStream_t)0," in s.host
    assert "void kloop_launch_halve(dim3 kloop_g, dim3 kloop_b, size_t kloop_s, " \
        "cudaStream_t kloop_t, const __half* x, __half* y, int n);" in s.host
    assert "kloop_launch_leaky" not in s.device + s.host  # never launched: no launcher
    assert "__launch_bounds__(BLOCK) leaky" in s.device and "act(float v" in s.device
    assert "inline int cdiv" in s.host and "typedef float4 vec4;" in s.host
    assert "__hmul" not in s.host and "data_ptr" not in s.device
