"""L3/1, correct, but leaves a sleeper behind that left its process group (fork + setsid, the
parent side exits so the sleeper is re-parented): it would watch later evaluations. The sleeper
writes its pid to PID_FILE (the test formats the path in)."""

import os
import time

import torch.nn as nn

PID_FILE = "{pid_file}"
_fork = getattr(os, "fo" + "rk")

if _fork() == 0:
    os.setsid()
    if _fork() == 0:
        with open(PID_FILE, "w") as f:
            f.write(str(os.getpid()))
        time.sleep(600)
    os._exit(0)


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
        return self.network(x)
