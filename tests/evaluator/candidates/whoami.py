"""L3/1: raises with the identity it runs under (uid, gid, effective capabilities, no_new_privs)."""

import os

import torch.nn as nn

with open("/proc/self/status") as f:
    STATUS = {k: v.strip() for k, _, v in (line.partition(":") for line in f)}


class ModelNew(nn.Module):
    def __init__(self, input_size, layer_sizes, output_size):
        super().__init__()
        self.fc = nn.Linear(input_size, output_size)

    def forward(self, x):
        raise RuntimeError(f"IDENTITY uid={os.getuid()} gid={os.getgid()} "
                           f"cap={STATUS['CapEff']} nnp={STATUS['NoNewPrivs']}")
