import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class NewGELU(nn.Module):
    """GELU, tanh approximation, written out by hand. Defined here but not used by Model."""

    def forward(self, x):
        inner = math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))
        return 0.5 * x * (1.0 + torch.tanh(inner))


class Model(nn.Module):
    def __init__(self, n_embd, n_head, max_seqlen):
        """Causal multi-head self-attention with ReLU in place of softmax and no output
        projection applied.

        :param n_embd: embedding size
        :param n_head: number of attention heads (must divide n_embd)
        :param max_seqlen: largest supported sequence length (size of the causal mask)
        """
        super().__init__()
        assert n_embd % n_head == 0
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        # Quirk kept from the reference: c_proj is created (parameters, RNG draws) but never used.
        self.c_proj = nn.Linear(n_embd, n_embd)
        mask = torch.tril(torch.ones(max_seqlen, max_seqlen))
        self.register_buffer("bias", mask.view(1, 1, max_seqlen, max_seqlen))
        self.n_head = n_head
        self.n_embd = n_embd

    def forward(self, x):
        """
        :param x: input of shape (batch_size, seq_len, n_embd), seq_len <= max_seqlen
        :return: output of shape (batch_size, seq_len, n_embd)
        """
        B, T, C = x.size()
        hs = C // self.n_head

        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)

        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.relu(att)  # -inf -> 0, so masked positions drop out
        y = att @ v  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return y


# Test configuration
batch_size = 16
max_seqlen = 1024
n_embd = 768
n_head = 12


def get_inputs():
    return [torch.rand(batch_size, max_seqlen, n_embd)]


def get_init_inputs():
    return [n_embd, n_head, max_seqlen]
