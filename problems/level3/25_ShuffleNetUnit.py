import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, groups=3):
        """ShuffleNet unit: grouped 1x1 conv, 3x3 depthwise conv, channel shuffle,
        grouped 1x1 conv, plus a shortcut (identity or 1x1 conv + BN).

        :param in_channels: number of input channels
        :param out_channels: number of output channels (multiple of 4)
        :param groups: number of groups of the 1x1 convs and of the channel shuffle
        """
        super().__init__()

        assert out_channels % 4 == 0
        mid_channels = out_channels // 4

        # First 1x1 group convolution
        self.conv1 = nn.Conv2d(in_channels, mid_channels, kernel_size=1, stride=1, padding=0,
                               groups=groups, bias=False)
        self.bn1 = nn.BatchNorm2d(mid_channels)

        # 3x3 depthwise convolution
        self.conv2 = nn.Conv2d(mid_channels, mid_channels, kernel_size=3, stride=1, padding=1,
                               groups=mid_channels, bias=False)
        self.bn2 = nn.BatchNorm2d(mid_channels)

        # Second 1x1 group convolution
        self.conv3 = nn.Conv2d(mid_channels, out_channels, kernel_size=1, stride=1, padding=0,
                               groups=groups, bias=False)
        self.bn3 = nn.BatchNorm2d(out_channels)

        self.shuffle = ChannelShuffle(groups)

        if in_channels == out_channels:
            self.shortcut = nn.Sequential()
        else:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, kernel_size=1, stride=1, padding=0, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x):
        """
        :param x: input of shape (batch_size, in_channels, height, width)
        :return: shape (batch_size, out_channels, height, width)
        """
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))  # no activation after the depthwise conv
        out = self.shuffle(out)
        out = F.relu(self.bn3(self.conv3(out)))
        # Quirk kept from the reference: ReLU before the residual add, none after it.
        out = out + self.shortcut(x)
        return out


class ChannelShuffle(nn.Module):
    def __init__(self, groups):
        """Interleave channels across groups.

        :param groups: number of channel groups
        """
        super().__init__()
        self.groups = groups

    def forward(self, x):
        batch_size, channels, height, width = x.size()
        channels_per_group = channels // self.groups
        x = x.view(batch_size, self.groups, channels_per_group, height, width)
        x = x.transpose(1, 2).contiguous()
        return x.view(batch_size, -1, height, width)


# Test configuration
batch_size = 10
input_channels = 240
out_channels = 480
groups = 3
height, width = 224, 224
num_classes = 1000  # unused, kept from the reference configuration


def get_inputs():
    return [torch.rand(batch_size, input_channels, height, width)]


def get_init_inputs():
    return [input_channels, out_channels, groups]
