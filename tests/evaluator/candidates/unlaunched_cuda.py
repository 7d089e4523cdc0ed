"""L3/1, correct, builds a CUDA ReLU extension and never calls it (catalog B5)."""

import torch.nn as nn
import torch.nn.functional as F
from torch.utils.cpp_extension import load_inline

cuda_source = r"""
#include <torch/extension.h>

__global__ void idle_relu_kernel(const float* __restrict__ x, float* __restrict__ y, long n) {
    long i = (long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] > 0.f ? x[i] : 0.f;
}

torch::Tensor idle_relu(torch::Tensor x) {
    auto y = torch::empty_like(x);
    long n = x.numel();
    idle_relu_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

ext = load_inline(name="kloop_test_idle_relu", cpp_sources="torch::Tensor idle_relu(torch::Tensor x);",
                  cuda_sources=cuda_source, functions=["idle_relu"], verbose=False)


class ModelNew(nn.Module):
    def __init__(self, input_size, layer_sizes, output_size):
        super().__init__()
        layers, current = [], input_size
        for hidden in layer_sizes:
            layers += [nn.Linear(current, hidden), nn.ReLU()]
            current = hidden
        layers.append(nn.Linear(current, output_size))
        self.network = nn.Sequential(*layers)

    def forward(self, x):
        linears = [m for m in self.network if isinstance(m, nn.Linear)]
        for lin in linears[:-1]:
            x = F.relu(F.linear(x, lin.weight, lin.bias))
        return F.linear(x, linears[-1].weight, linears[-1].bias)
