import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl

BLOCK = 256


@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=mask)


def relu(x):
    x = x.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    relu_kernel[(triton.cdiv(n, BLOCK),)](x, out, BLOCK=BLOCK)
    return out


class ModelNew(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels=1, out_channels=6, kernel_size=5, stride=1)
        self.conv2 = nn.Conv2d(in_channels=6, out_channels=16, kernel_size=5, stride=1)
        self.fc1 = nn.Linear(in_features=16 * 5 * 5, out_features=120)
        self.fc2 = nn.Linear(in_features=120, out_features=84)
        self.fc3 = nn.Linear(in_features=84, out_features=num_classes)

    def forward(self, x):
        x = F.max_pool2d(relu(self.conv1(x)), kernel_size=2, stride=2)
        x = F.max_pool2d(relu(self.conv2(x)), kernel_size=2, stride=2)
        x = x.reshape(x.shape[0], -1)
        x = relu(self.fc1(x))
        x = relu(self.fc2(x))
        return self.fc3(x)
