import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, input_size, layer_sizes, output_size):
        """Plain multi-layer perceptron: (Linear -> ReLU) per hidden size, then a final Linear.

        :param input_size: number of input features
        :param layer_sizes: list of hidden layer sizes
        :param output_size: number of output features
        """
        super().__init__()
        layers = []
        current = input_size
        for hidden in layer_sizes:
            layers.append(nn.Linear(current, hidden))
            layers.append(nn.ReLU())
            current = hidden
        layers.append(nn.Linear(current, output_size))
        self.network = nn.Sequential(*layers)

    def forward(self, x):
        """
        :param x: input of shape (batch_size, input_size)
        :return: output of shape (batch_size, output_size)
        """
        return self.network(x)


# Test configuration
batch_size = 128
input_size = 16384
layer_sizes = [16384, 16384]
output_size = 8192


def get_inputs():
    return [torch.rand(batch_size, input_size)]


def get_init_inputs():
    return [input_size, layer_sizes, output_size]
