"""Honest Triton candidate for L3/50 (50_ReLUSelfAttention) at small sizes: the qkv projection
stays in PyTorch; one Triton program per (batch, head) computes relu(causal(q k^T / sqrt(hs))) v.

The whole sequence fits in one block, so this is for short sequences (tests run it with
max_seqlen=16); the layers are built in the reference's order (c_proj too, although unused).
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl


@triton.jit
def relu_attention_kernel(qkv_ptr, y_ptr, T, C, n_head, scale,
                          HS: tl.constexpr, BLOCK_T: tl.constexpr):
    pid = tl.program_id(0)
    b = pid // n_head
    h = pid % n_head
    offs_t = tl.arange(0, BLOCK_T)
    offs_d = tl.arange(0, HS)
    rows = qkv_ptr + b * T * 3 * C + offs_t[:, None] * (3 * C)
    valid = offs_t[:, None] < T
    q = tl.load(rows + h * HS + offs_d[None, :], mask=valid, other=0.0)
    k = tl.load(rows + C + h * HS + offs_d[None, :], mask=valid, other=0.0)
    v = tl.load(rows + 2 * C + h * HS + offs_d[None, :], mask=valid, other=0.0)
    att = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
    causal = offs_t[:, None] >= offs_t[None, :]
    att = tl.where(causal, tl.maximum(att, 0.0), 0.0)
    y = tl.dot(att, v, input_precision="ieee")
    tl.store(y_ptr + b * T * C + offs_t[:, None] * C + h * HS + offs_d[None, :], y, mask=valid)


class ModelNew(nn.Module):
    def __init__(self, n_embd, n_head, max_seqlen):
        super().__init__()
        assert n_embd % n_head == 0
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.register_buffer(
            "bias", torch.tril(torch.ones(max_seqlen, max_seqlen)).view(1, 1, max_seqlen, max_seqlen)
        )
        self.n_head = n_head
        self.n_embd = n_embd

    def forward(self, x):
        B, T, C = x.size()
        hs = C // self.n_head
        qkv = F.linear(x, self.c_attn.weight, self.c_attn.bias).contiguous()
        y = torch.empty((B, T, C), device=x.device, dtype=x.dtype)
        relu_attention_kernel[(B * self.n_head,)](
            qkv, y, T, C, self.n_head, 1.0 / math.sqrt(hs),
            HS=hs, BLOCK_T=max(16, triton.next_power_of_2(T)),
        )
        return y
