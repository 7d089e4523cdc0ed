import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def small_matmul_kernel(a_ptr, b_ptr, c_ptr, B: tl.constexpr):
    r = tl.arange(0, B)
    a = tl.load(a_ptr + r[:, None] * B + r[None, :])
    b = tl.load(b_ptr + r[:, None] * B + r[None, :])
    c = tl.dot(a, b)
    tl.store(c_ptr + r[:, None] * B + r[None, :], c)


class ModelNew(nn.Module):
    def forward(self, a, b):
        c = torch.empty_like(a)
        small_matmul_kernel[(1,)](a, b, c, B=a.shape[0])
        return c
