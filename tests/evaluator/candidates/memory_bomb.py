"""L3/1, allocates 100 GB in forward."""

import torch
import torch.nn as nn


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
        out = self.network(x)
        hog = torch.ones(25 * 1024**3, dtype=torch.float32)
        return out + hog[0]
