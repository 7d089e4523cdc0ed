import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, input_size, hidden_size, num_layers, output_size, dropout=0.0):
        """Multi-layer unidirectional LSTM followed by a linear layer on the last time step.

        :param input_size: number of input features
        :param hidden_size: LSTM hidden size
        :param num_layers: number of stacked LSTM layers
        :param output_size: number of output features
        :param dropout: dropout between LSTM layers
        """
        super().__init__()
        self.hidden_size = hidden_size
        self.num_layers = num_layers
        self.lstm = nn.LSTM(input_size, hidden_size, num_layers, batch_first=True, dropout=dropout,
                            bidirectional=False)
        self.fc = nn.Linear(hidden_size, output_size)

    def forward(self, x, h0=None, c0=None):
        """
        :param x: input of shape (batch_size, sequence_length, input_size)
        :param h0: optional initial hidden state (num_layers, batch_size, hidden_size)
        :param c0: optional initial cell state (num_layers, batch_size, hidden_size)
        :return: output of shape (batch_size, output_size)
        """
        batch_size = x.size(0)

        # Quirk kept from the reference: missing initial states are drawn at call time
        # from the generator of x's device (h0 first, then c0).
        if h0 is None:
            h0 = torch.randn(self.num_layers, batch_size, self.hidden_size, device=x.device)
        if c0 is None:
            c0 = torch.randn(self.num_layers, batch_size, self.hidden_size, device=x.device)

        out, _ = self.lstm(x, (h0, c0))  # (batch_size, seq_length, hidden_size)
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
    return [torch.rand(batch_size, sequence_length, input_size)]


def get_init_inputs():
    return [input_size, hidden_size, num_layers, output_size, dropout]
