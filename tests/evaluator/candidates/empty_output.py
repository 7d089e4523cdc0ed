"""L3/1: returns an uninitialised tensor of the right shape, hoping it holds the reference's
freed result (catalog C1). The reference output never exists in this process."""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, input_size, layer_sizes, output_size):
        super().__init__()
        self.output_size = output_size
        self.dummy = nn.Linear(1, 1)

    def forward(self, x):
        return torch.empty(x.shape[0], self.output_size, device=x.device, dtype=x.dtype)
