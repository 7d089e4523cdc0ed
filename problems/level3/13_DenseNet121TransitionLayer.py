import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, num_input_features: int, num_output_features: int):
        """DenseNet transition layer: BN -> ReLU -> 1x1 conv -> 2x2 average pool.

        :param num_input_features: number of input channels
        :param num_output_features: number of output channels
        """
        super().__init__()
        self.transition = nn.Sequential(
            nn.BatchNorm2d(num_input_features),
            nn.ReLU(inplace=True),
            nn.Conv2d(num_input_features, num_output_features, kernel_size=1, bias=False),
            nn.AvgPool2d(kernel_size=2, stride=2),
        )

    def forward(self, x):
        """
        :param x: input of shape (batch_size, num_input_features, height, width)
        :return: output of shape (batch_size, num_output_features, height // 2, width // 2)
        """
        return self.transition(x)


# Test configuration
batch_size = 128
num_input_features = 32
num_output_features = 64
height, width = 256, 256


def get_inputs():
    return [torch.rand(batch_size, num_input_features, height, width)]


def get_init_inputs():
    return [num_input_features, num_output_features]
