import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, input_channels, stages, block_widths, output_classes):
        """RegNet-style network: plain conv stages, global average pooling, linear classifier.

        :param input_channels: number of input channels
        :param stages: number of stages
        :param block_widths: output channels of each stage
        :param output_classes: number of output classes
        """
        super().__init__()

        self.stages = stages
        self.block_widths = block_widths

        layers = []
        current_channels = input_channels
        for i in range(stages):
            layers.append(self._make_stage(current_channels, block_widths[i]))
            current_channels = block_widths[i]

        self.feature_extractor = nn.Sequential(*layers)
        self.fc = nn.Linear(block_widths[-1], output_classes)

    def _make_stage(self, in_channels, out_channels):
        """Two conv3x3-BN-ReLU layers followed by a 2x2 max pool."""
        return nn.Sequential(
            nn.Conv2d(in_channels, out_channels, kernel_size=3, padding=1),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(),
            nn.Conv2d(out_channels, out_channels, kernel_size=3, padding=1),
            nn.BatchNorm2d(out_channels),
            nn.ReLU(),
            nn.MaxPool2d(kernel_size=2, stride=2),
        )

    def forward(self, x):
        """
        :param x: input of shape (batch_size, input_channels, height, width)
        :return: logits of shape (batch_size, output_classes)
        """
        x = self.feature_extractor(x)
        x = torch.mean(x, dim=[2, 3])  # global average pooling
        x = self.fc(x)
        return x


# Test configuration
batch_size = 8
input_channels = 3
image_height = 224
image_width = 224
stages = 3
block_widths = [64, 128, 256]
output_classes = 10


def get_inputs():
    return [torch.rand(batch_size, input_channels, image_height, image_width)]


def get_init_inputs():
    return [input_channels, stages, block_widths, output_classes]
