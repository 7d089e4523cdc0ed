import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, num_classes=1000, input_channels=3, alpha=1.0):
        """MobileNet v1: a strided 3x3 conv followed by 13 depthwise-separable blocks.

        :param num_classes: number of output classes
        :param input_channels: number of input image channels
        :param alpha: width multiplier applied to every channel count
        """
        super().__init__()

        def conv_bn(inp, oup, stride):
            """3x3 conv -> BN -> ReLU."""
            return nn.Sequential(
                nn.Conv2d(inp, oup, 3, stride, 1, bias=False),
                nn.BatchNorm2d(oup),
                nn.ReLU(inplace=True),
            )

        def conv_dw(inp, oup, stride):
            """3x3 depthwise conv -> BN -> ReLU -> 1x1 pointwise conv -> BN -> ReLU."""
            return nn.Sequential(
                nn.Conv2d(inp, inp, 3, stride, 1, groups=inp, bias=False),
                nn.BatchNorm2d(inp),
                nn.ReLU(inplace=True),
                nn.Conv2d(inp, oup, 1, 1, 0, bias=False),
                nn.BatchNorm2d(oup),
                nn.ReLU(inplace=True),
            )

        def c(n):
            return int(n * alpha)

        self.model = nn.Sequential(
            conv_bn(input_channels, c(32), 2),
            conv_dw(c(32), c(64), 1),
            conv_dw(c(64), c(128), 2),
            conv_dw(c(128), c(128), 1),
            conv_dw(c(128), c(256), 2),
            conv_dw(c(256), c(256), 1),
            conv_dw(c(256), c(512), 2),
            conv_dw(c(512), c(512), 1),
            conv_dw(c(512), c(512), 1),
            conv_dw(c(512), c(512), 1),
            conv_dw(c(512), c(512), 1),
            conv_dw(c(512), c(512), 1),
            conv_dw(c(512), c(1024), 2),
            conv_dw(c(1024), c(1024), 1),
            nn.AvgPool2d(7),
        )
        self.fc = nn.Linear(c(1024), num_classes)

    def forward(self, x):
        """
        :param x: input of shape (batch_size, input_channels, 224, 224)
        :return: logits of shape (batch_size, num_classes)
        """
        x = self.model(x)
        x = x.view(x.size(0), -1)
        return self.fc(x)


# Test configuration
batch_size = 10
input_channels = 3
height, width = 224, 224
num_classes = 1000
alpha = 1.0


def get_inputs():
    return [torch.rand(batch_size, input_channels, height, width)]


def get_init_inputs():
    return [num_classes, input_channels, alpha]
