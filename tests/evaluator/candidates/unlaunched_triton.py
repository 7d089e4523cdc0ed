"""L3/1, correct, defines a Triton kernel but never launches it (catalog B5)."""

import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def relu_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)


class ModelNew(nn.Module):
    def __init__(self, input_size, layer_sizes, output_size):
        super().__init__()
        layers, current = [], input_size
        for hidden in layer_sizes:
            layers += [nn.Linear(current, hidden), nn.ReLU()]
            current = hidden
        layers.append(nn.Linear(current, output_size))
        self.network = nn.Sequential(*layers)
        self.use_kernel = False

    def forward(self, x):
        linears = [m for m in self.network if isinstance(m, nn.Linear)]
        for lin in linears[:-1]:
            x = F.relu(F.linear(x, lin.weight, lin.bias))
        return F.linear(x, linears[-1].weight, linears[-1].bias)
