import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, input_size, hidden_size, num_layers=3, bias=True, batch_first=False):
        """Multi-layer unidirectional GRU (sequence first by default); returns the output sequence.

        :param input_size: number of features per time step
        :param hidden_size: hidden state size of each direction
        :param num_layers: number of stacked GRU layers
        :param bias: whether the GRU layers use biases
        :param batch_first: if True, inputs are (batch, seq, feature)
        """
        super().__init__()
        self.gru = nn.GRU(
            input_size,
            hidden_size,
            num_layers,
            bias,
            batch_first,
            dropout=0,
            bidirectional=False,
        )

    def forward(self, x, h0):
        """
        :param x: input of shape (seq_len, batch_size, input_size)
        :param h0: initial hidden state of shape (num_layers, batch_size, hidden_size)
        :return: output sequence of shape (seq_len, batch_size, hidden_size)
        """
        output, h_n = self.gru(x, h0)
        return output


# Test configuration
batch_size = 10
seq_len = 512
input_size = 128
hidden_size = 256
num_layers = 6


def get_inputs():
    return [
        torch.rand(seq_len, batch_size, input_size),
        torch.rand(num_layers, batch_size, hidden_size),
    ]


def get_init_inputs():
    return [input_size, hidden_size, num_layers]
