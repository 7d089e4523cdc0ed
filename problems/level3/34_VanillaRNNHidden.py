import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, input_size: int, hidden_size: int, output_size: int):
        """Elman RNN cell unrolled over a sequence; returns the output of every step.

        :param input_size: number of input features
        :param hidden_size: size of the hidden state
        :param output_size: number of output features
        """
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.output_size = output_size

        self.i2h = nn.Linear(input_size + hidden_size, hidden_size)  # input + hidden -> hidden
        self.h2o = nn.Linear(hidden_size, output_size)  # hidden -> output
        self.tanh = nn.Tanh()

    def forward(self, x: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
        """
        :param x: input sequence of shape (seq_len, batch_size, input_size)
        :param h0: initial hidden state of shape (batch_size, hidden_size)
        :return: outputs of shape (seq_len, batch_size, output_size)
        """
        seq_len, batch_size, _ = x.size()
        hidden = h0.to(x.device)
        outputs = []

        for t in range(seq_len):
            combined = torch.cat((x[t], hidden), dim=1)  # (batch_size, input_size + hidden_size)
            hidden = self.tanh(self.i2h(combined))
            outputs.append(self.h2o(hidden))

        return torch.stack(outputs, dim=0)


# Test configuration
batch_size = 8
input_size = 1024
hidden_size = 256
output_size = 128
sequence_length = 256


def get_inputs():
    return [torch.rand(sequence_length, batch_size, input_size), torch.rand(batch_size, hidden_size)]


def get_init_inputs():
    return [input_size, hidden_size, output_size]
