import torch
import torch.nn as nn
import torch.nn.functional as F
from einops import rearrange


class Model(nn.Module):
    def __init__(self, batch_size, seq_length, n_heads, d_head, d_state, block_len=64):
        """Mamba-2 structured state-space duality (SSD), minimal chunked scan; returns the
        final inter-chunk state.

        A, B and C are free parameters whose shapes include the batch size, so the model only
        accepts inputs with exactly `batch_size` samples.

        :param batch_size: batch size the parameters are shaped for
        :param seq_length: sequence length (a multiple of block_len)
        :param n_heads: number of heads
        :param d_head: head dimension
        :param d_state: state dimension
        :param block_len: chunk length of the scan
        """
        super().__init__()
        assert seq_length % block_len == 0, "Sequence length must be divisible by block length"

        self.batch_size = batch_size
        self.seq_length = seq_length
        self.n_heads = n_heads
        self.d_head = d_head
        self.d_state = d_state
        self.block_len = block_len

        # Drawn in this order: A, B, C.
        self.A = nn.Parameter(torch.randn(batch_size, seq_length, n_heads))
        self.B = nn.Parameter(torch.randn(batch_size, seq_length, n_heads, d_state))
        self.C = nn.Parameter(torch.randn(batch_size, seq_length, n_heads, d_state))

    def segsum(self, x):
        """Segment sums: out[..., i, j] = sum(x[..., j+1:i+1]) for j <= i, -inf for j > i."""
        T = x.size(-1)
        x_cumsum = torch.cumsum(x, dim=-1)
        x_segsum = x_cumsum[..., :, None] - x_cumsum[..., None, :]
        mask = torch.tril(torch.ones(T, T, device=x.device, dtype=torch.bool), diagonal=0)
        x_segsum = x_segsum.masked_fill(~mask, -torch.inf)
        return x_segsum

    def forward(self, X, initial_states=None):
        """
        :param X: input of shape (batch_size, seq_length, n_heads, d_head)
        :param initial_states: optional initial state of shape
            (batch_size, 1, n_heads, d_head, d_state)
        :return: final state of shape (batch_size, n_heads, d_head, d_state)
        """
        # Split the sequence into chunks of block_len.
        X_blocks, A_blocks, B_blocks, C_blocks = [
            rearrange(t, "b (c l) ... -> b c l ...", l=self.block_len)
            for t in (X, self.A, self.B, self.C)
        ]

        A_blocks = rearrange(A_blocks, "b c l h -> b h c l")
        A_cumsum = torch.cumsum(A_blocks, dim=-1)

        # 1. Outputs within each chunk (diagonal blocks).
        # Quirk kept from the reference: Y_diag is computed but not used for the final state.
        L = torch.exp(self.segsum(A_blocks))
        Y_diag = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", C_blocks, B_blocks, L, X_blocks)

        # 2. State at the end of each chunk.
        decay_states = torch.exp(A_cumsum[:, :, :, -1:] - A_cumsum)
        states = torch.einsum("bclhn,bhcl,bclhp->bchpn", B_blocks, decay_states, X_blocks)

        # 3. Propagate states across chunks.
        if initial_states is None:
            initial_states = torch.zeros_like(states[:, :1])
        states = torch.cat([initial_states, states], dim=1)

        decay_chunk = torch.exp(self.segsum(F.pad(A_cumsum[:, :, :, -1], (1, 0))))
        new_states = torch.einsum("bhzc,bchpn->bzhpn", decay_chunk, states)
        states = new_states[:, :-1]  # unused here; kept as in the reference

        return new_states[:, -1]


# Test configuration
batch_size = 2048
seq_length = 128
n_heads = 8
d_head = 64
d_state = 16
block_len = 64


def get_inputs():
    return [torch.rand(batch_size, seq_length, n_heads, d_head)]


def get_init_inputs():
    return [batch_size, seq_length, n_heads, d_head, d_state, block_len]
