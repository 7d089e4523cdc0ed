import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_channels, out_1x1, reduce_3x3, out_3x3, reduce_5x5, out_5x5, pool_proj):
        """One GoogLeNet inception block: four parallel branches concatenated on channels.

        :param in_channels: number of input channels
        :param out_1x1: output channels of the 1x1 branch
        :param reduce_3x3: channels of the 1x1 reduction before the 3x3 conv
        :param out_3x3: output channels of the 3x3 branch
        :param reduce_5x5: channels of the 1x1 reduction before the 5x5 conv
        :param out_5x5: output channels of the 5x5 branch
        :param pool_proj: output channels of the 1x1 projection after max pooling
        """
        super().__init__()
        # Quirk kept from the reference: no activation (and no BN) anywhere in the block.
        self.branch1x1 = nn.Conv2d(in_channels, out_1x1, kernel_size=1)

        self.branch3x3 = nn.Sequential(
            nn.Conv2d(in_channels, reduce_3x3, kernel_size=1),
            nn.Conv2d(reduce_3x3, out_3x3, kernel_size=3, padding=1),
        )

        self.branch5x5 = nn.Sequential(
            nn.Conv2d(in_channels, reduce_5x5, kernel_size=1),
            nn.Conv2d(reduce_5x5, out_5x5, kernel_size=5, padding=2),
        )

        self.branch_pool = nn.Sequential(
            nn.MaxPool2d(kernel_size=3, stride=1, padding=1),
            nn.Conv2d(in_channels, pool_proj, kernel_size=1),
        )

    def forward(self, x):
        """
        :param x: input of shape (batch_size, in_channels, height, width)
        :return: (batch_size, out_1x1 + out_3x3 + out_5x5 + pool_proj, height, width)
        """
        branch1x1 = self.branch1x1(x)
        branch3x3 = self.branch3x3(x)
        branch5x5 = self.branch5x5(x)
        branch_pool = self.branch_pool(x)
        return torch.cat([branch1x1, branch3x3, branch5x5, branch_pool], dim=1)


# Test configuration
in_channels = 480
out_1x1 = 192
reduce_3x3 = 96
out_3x3 = 208
reduce_5x5 = 16
out_5x5 = 48
pool_proj = 64
batch_size = 10
height = 224
width = 224


def get_inputs():
    return [torch.rand(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_1x1, reduce_3x3, out_3x3, reduce_5x5, out_5x5, pool_proj]
