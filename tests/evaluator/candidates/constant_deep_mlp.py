"""L3/3 (DeepNarrowMLP, degenerate at 1e-4): computes one forward, then returns that output for
every later call, whatever the input (catalog C5). Its output does not depend on the input at
the tolerance, so only a trial with other parameters can tell."""

import torch.nn as nn

_FIRST = []


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
        if not _FIRST:
            _FIRST.append(self.network(x[:1]))
        return _FIRST[0].expand(x.shape[0], -1).clone()
