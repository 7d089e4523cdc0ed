import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, n_embd, n_head, attn_pdrop, resid_pdrop, max_seqlen):
        """Causal multi-head self-attention with an output projection (minGPT style).

        :param n_embd: embedding size
        :param n_head: number of attention heads (must divide n_embd)
        :param attn_pdrop: dropout probability on the attention weights
        :param resid_pdrop: dropout probability on the output
        :param max_seqlen: largest supported sequence length (size of the causal mask)
        """
        super().__init__()
        assert n_embd % n_head == 0
        # Query, key and value projections for all heads in one layer.
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout = nn.Dropout(attn_pdrop)
        self.resid_dropout = nn.Dropout(resid_pdrop)
        # Lower-triangular causal mask, kept as a (persistent) float buffer.
        mask = torch.tril(torch.ones(max_seqlen, max_seqlen))
        self.register_buffer("bias", mask.view(1, 1, max_seqlen, max_seqlen))
        self.n_head = n_head
        self.n_embd = n_embd

    def forward(self, x):
        """
        :param x: input of shape (batch_size, seq_len, n_embd)
        :return: output of shape (batch_size, seq_len, n_embd)
        """
        B, T, C = x.size()
        hs = C // self.n_head

        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)  # (B, nh, T, hs)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)

        # Explicit attention: scale by multiplying with the reciprocal square root.
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v  # (B, nh, T, hs)
        y = y.transpose(1, 2).contiguous().view(B, T, C)

        return self.resid_dropout(self.c_proj(y))


# Test configuration
batch_size = 128
max_seqlen = 1024
seq_len = 512
n_embd = 768
n_head = 8
attn_pdrop = 0.0
resid_pdrop = 0.0


def get_inputs():
    return [torch.rand(batch_size, seq_len, n_embd)]


def get_init_inputs():
    return [n_embd, n_head, attn_pdrop, resid_pdrop, max_seqlen]
