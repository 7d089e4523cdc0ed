"""L3/1: forward returns at once and a worker thread (reached through `queue`, which the static
rule does not see) writes the output a moment later (catalog T2)."""

import queue
import time

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

    def _fill(self, x, out):
        time.sleep(0.05)
        with torch.no_grad():
            out.copy_(self.network(x))

    def forward(self, x):
        out = torch.empty(x.shape[0], self.network[-1].out_features)
        queue.threading.Thread(target=self._fill, args=(x, out)).start()
        return out
