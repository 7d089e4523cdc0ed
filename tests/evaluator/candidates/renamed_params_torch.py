"""Honest plain-PyTorch candidate for L3/1 whose parameters have other names than the
reference's (`fc0.weight`...): every build, the reparam trial's too, must still give it the
reference's values (they are drawn in the same order)."""

import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, input_size, layer_sizes, output_size):
        super().__init__()
        sizes = [input_size, *layer_sizes, output_size]
        self.fcs = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes[:-1], sizes[1:], strict=True))

    def forward(self, x):
        for fc in self.fcs[:-1]:
            x = F.relu(fc(x))
        return self.fcs[-1](x)
