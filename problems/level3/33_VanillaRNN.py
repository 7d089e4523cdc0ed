import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, input_size: int, hidden_size: int, output_size: int):
        """One step of an Elman RNN cell whose hidden state is kept on the module.

        :param input_size: number of input features
        :param hidden_size: size of the hidden state
        :param output_size: number of output features
        """
        super().__init__()
        self.input_size = input_size
        self.hidden_size = hidden_size
        self.output_size = output_size
        # Quirk kept from the reference: a plain tensor attribute (not a parameter/buffer),
        # shaped by the module-level `batch_size` and drawn before the layers are built.
        self.hidden = torch.randn((batch_size, hidden_size))

        self.i2h = nn.Linear(input_size + hidden_size, hidden_size)  # input + hidden -> hidden
        self.h2o = nn.Linear(hidden_size, output_size)  # hidden -> output
        self.tanh = nn.Tanh()

    def forward(self, x: torch.Tensor, initial_hidden=None) -> torch.Tensor:
        """
        :param x: input of shape (batch_size, input_size)
        :param initial_hidden: optional hidden state of shape (batch_size, hidden_size)
        :return: output of shape (batch_size, output_size)
        """
        if initial_hidden is not None:
            self.hidden.copy_(initial_hidden)
        self.hidden = self.hidden.to(x.device)
        combined = torch.cat((x, self.hidden), dim=1)  # (batch_size, input_size + hidden_size)
        self.hidden = self.tanh(self.i2h(combined))  # new hidden state
        output = self.h2o(self.hidden)
        return output


# Test configuration
batch_size = 256
input_size = 16384
hidden_size = 16384
output_size = 8192
sequence_length = 256


def get_inputs():
    return [torch.rand(batch_size, input_size), torch.rand(batch_size, hidden_size)]


def get_init_inputs():
    return [input_size, hidden_size, output_size]
