import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, input_size, hidden_size, num_layers, output_size, dropout=0.0):
        """Multi-layer bidirectional LSTM (batch first) followed by a Linear layer on the last
        time step.

        :param input_size: number of features per time step
        :param hidden_size: hidden state size of each direction
        :param num_layers: number of stacked LSTM layers
        :param output_size: number of output features
        :param dropout: dropout between LSTM layers
        """
        super().__init__()
        self.lstm = nn.LSTM(
            input_size,
            hidden_size,
            num_layers,
            batch_first=True,
            dropout=dropout,
            bidirectional=True,
        )
        self.fc = nn.Linear(hidden_size * 2, output_size)

    def forward(self, x, h0, c0):
        """
        :param x: input of shape (batch_size, sequence_length, input_size)
        :param h0: initial hidden state of shape (num_layers * 2, batch_size, hidden_size)
        :param c0: initial cell state of shape (num_layers * 2, batch_size, hidden_size)
        :return: output of shape (batch_size, output_size)
        """
        out, _ = self.lstm(x, (h0, c0))
        # Last time step of both directions concatenated.
        return self.fc(out[:, -1, :])


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
        torch.rand(num_layers * 2, batch_size, hidden_size),
        torch.rand(num_layers * 2, batch_size, hidden_size),
    ]


def get_init_inputs():
    return [input_size, hidden_size, num_layers, output_size, dropout]
