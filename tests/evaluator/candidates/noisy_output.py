"""L3/1, correct within the tolerance, but every call adds different noise far below it (as a
kernel with atomics would): two calls on the same inputs differ in the last bits."""

import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, input_size, layer_sizes, output_size):
        super().__init__()
        layers, current = [], input_size
        for hidden in layer_sizes:
            layers += [nn.Linear(current, hidden), nn.ReLU()]
            current = hidden
        layers.append(nn.Linear(current, output_size))
        self.network = nn.Sequential(*layers)
        self.gen = torch.Generator().manual_seed(0)

    def forward(self, x):
        linears = [m for m in self.network if isinstance(m, nn.Linear)]
        for lin in linears[:-1]:
            x = F.relu(F.linear(x, lin.weight, lin.bias))
        out = F.linear(x, linears[-1].weight, linears[-1].bias)
        noise = torch.rand(out.shape, generator=self.gen).to(out.device) * 1e-7
        return out + noise
