"""Fills the disk the other evaluations share: writes into its own TMPDIR (the only place it
may write) until something stops it, in 16 MiB files, then works as an honest MLP."""

import os

import torch.nn as nn

_dir = os.environ["TMPDIR"]
_chunk = b"\0" * (16 << 20)
for _i in range(64):  # 1 GiB at most, so a harness without the limit does not fill the disk
    with open(os.path.join(_dir, f"fill-{_i}"), "wb") as _f:
        _f.write(_chunk)
        _f.flush()
        os.fsync(_f.fileno())


class ModelNew(nn.Module):
    def __init__(self, input_size, layer_sizes, output_size):
        super().__init__()
        layers, current = [], input_size
        for size in layer_sizes:
            layers += [nn.Linear(current, size), nn.ReLU()]
            current = size
        layers.append(nn.Linear(current, output_size))
        self.network = nn.Sequential(*layers)

    def forward(self, x):
        return self.network(x)
