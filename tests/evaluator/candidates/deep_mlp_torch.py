"""Honest plain-PyTorch candidate for L3/3 (DeepNarrowMLP): the same layers, called explicitly."""

import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, input_size, hidden_layer_sizes, output_size):
        super().__init__()
        layers, current = [], input_size
        for hidden in hidden_layer_sizes:
            layers += [nn.Linear(current, hidden), nn.ReLU()]
            current = hidden
        layers.append(nn.Linear(current, output_size))
        self.network = nn.Sequential(*layers)

    def forward(self, x):
        linears = [m for m in self.network if isinstance(m, nn.Linear)]
        for lin in linears[:-1]:
            x = F.relu(F.linear(x, lin.weight, lin.bias))
        return F.linear(x, linears[-1].weight, linears[-1].bias)
