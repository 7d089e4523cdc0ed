"""L3/1, correct, but leaves a sleeper behind that left its process group (fork + setsid, the
parent side exits so the sleeper is re-parented): it would watch later evaluations. The sleeper
writes its pid to PID_FILE, then becomes `sleep SLEEP_S` (the test formats both in)."""

import os

import torch.nn as nn

PID_FILE = "{pid_file}"
_fork = getattr(os, "fo" + "rk")

if _fork() == 0:
    os.setsid()
    if _fork() == 0:
        with open(PID_FILE, "w") as f:
            f.write(str(os.getpid()))
        # A command line the test can find from outside (its pid there may differ: a PID
        # namespace of the child's own).
        getattr(os, "ex" + "ecv")("/bin/sleep", ["sleep", "{sleep_s}"])
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
