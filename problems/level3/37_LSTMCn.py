import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, input_size, hidden_size, num_layers, output_size, dropout=0.0):
        """Multi-layer unidirectional LSTM; returns the final cell state of every layer.

        :param input_size: number of input features
        :param hidden_size: LSTM hidden size
        :param num_layers: number of stacked LSTM layers
        :param output_size: output size of the (unused) linear layer
        :param dropout: dropout between LSTM layers
        """
        super().__init__()
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers, batch_first=True, dropout=dropout,
                            bidirectional=False)
        self.fc = nn.Linear(hidden_size, output_size)

    def forward(self, x, h0, c0):
        """
        :param x: input of shape (batch_size, sequence_length, input_size)
        :param h0: initial hidden state (num_layers, batch_size, hidden_size)
        :param c0: initial cell state (num_layers, batch_size, hidden_size)
        :return: final cell state of shape (num_layers, batch_size, hidden_size)
        """
        out, state = self.lstm(x, (h0, c0))  # out: (batch_size, seq_length, hidden_size)

        # Quirk kept from the reference: dead code, the result is discarded.
        out = self.fc(out[:, -1, :])

        return state[1]


# Test configuration
batch_size = 10
sequence_length = 512
input_size = 128
hidden_size = 256
num_layers = 6
output_size = 10
dropout = 0.0


def get_inputs():
    return [
        torch.rand(batch_size, sequence_length, input_size),
        torch.rand(num_layers, batch_size, hidden_size),
        torch.rand(num_layers, batch_size, hidden_size),
    ]


def get_init_inputs():
    return [input_size, hidden_size, num_layers, output_size, dropout]
