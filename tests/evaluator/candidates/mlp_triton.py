"""Honest Triton candidate for L3/1 (1_MLP): one fused linear(+ReLU) kernel per layer.

fp32 throughout, `input_precision="ieee"` so the dot products are true fp32 (no TF32), big
blocks so the CPU interpreter stays fast. The nn.Linear layers are built exactly as in the
reference (same order, same seed-42 initialisation); only their forward is replaced.
"""

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def linear_kernel(x_ptr, w_ptr, b_ptr, y_ptr, M, N, K,
                  stride_xm, stride_xk, stride_wn, stride_wk, stride_ym, stride_yn,
                  APPLY_RELU: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + offs_k
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + kk[None, :] * stride_xk,
                    mask=(offs_m[:, None] < M) & (kk[None, :] < K), other=0.0)
        w = tl.load(w_ptr + offs_n[None, :] * stride_wn + kk[:, None] * stride_wk,
                    mask=(offs_n[None, :] < N) & (kk[:, None] < K), other=0.0)
        acc += tl.dot(x, w, input_precision="ieee")
    bias = tl.load(b_ptr + offs_n, mask=offs_n < N, other=0.0)
    acc += bias[None, :]
    if APPLY_RELU:
        acc = tl.maximum(acc, 0.0)
    tl.store(y_ptr + offs_m[:, None] * stride_ym + offs_n[None, :] * stride_yn, acc,
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def linear(x, weight, bias, relu):
    x = x.contiguous()
    M, K = x.shape
    N = weight.shape[0]
    y = torch.empty((M, N), device=x.device, dtype=x.dtype)
    BLOCK_M, BLOCK_N, BLOCK_K = 16, 64, 64
    grid = (triton.cdiv(M, BLOCK_M), triton.cdiv(N, BLOCK_N))
    linear_kernel[grid](x, weight, bias, y, M, N, K,
                        x.stride(0), x.stride(1), weight.stride(0), weight.stride(1),
                        y.stride(0), y.stride(1),
                        APPLY_RELU=relu, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
    return y


class ModelNew(nn.Module):
    def __init__(self, input_size, layer_sizes, output_size):
        super().__init__()
        layers = []
        current = input_size
        for hidden in layer_sizes:
            layers.append(nn.Linear(current, hidden))
            layers.append(nn.ReLU())
            current = hidden
        layers.append(nn.Linear(current, output_size))
        self.network = nn.Sequential(*layers)

    def forward(self, x):
        linears = [m for m in self.network if isinstance(m, nn.Linear)]
        for i, lin in enumerate(linears):
            x = linear(x, lin.weight, lin.bias, relu=i < len(linears) - 1)
        return x
