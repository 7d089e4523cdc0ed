import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, num_layers: int, num_input_features: int, growth_rate: int):
        """One DenseNet dense block (BN -> ReLU -> 3x3 conv per layer, no bottleneck).

        :param num_layers: number of dense layers in the block
        :param num_input_features: number of input channels
        :param growth_rate: channels added by each layer
        """
        super().__init__()
        layers = []
        for i in range(num_layers):
            layers.append(self._make_layer(num_input_features + i * growth_rate, growth_rate))
        self.layers = nn.ModuleList(layers)

    def _make_layer(self, in_features: int, growth_rate: int):
        """BN -> ReLU -> 3x3 conv (no bias) -> Dropout(0.0)."""
        return nn.Sequential(
            nn.BatchNorm2d(in_features),
            nn.ReLU(inplace=True),
            nn.Conv2d(in_features, growth_rate, kernel_size=3, padding=1, bias=False),
            nn.Dropout(0.0),
        )

    def forward(self, x):
        """
        :param x: input of shape (batch_size, num_input_features, height, width)
        :return: shape (batch_size, num_input_features + num_layers * growth_rate, height, width)
        """
        features = [x]
        for layer in self.layers:
            new_feature = layer(x)
            features.append(new_feature)
            x = torch.cat(features, 1)
        return x


# Test configuration
batch_size = 10
num_layers = 6
num_input_features = 32
growth_rate = 32
height, width = 224, 224


def get_inputs():
    return [torch.rand(batch_size, num_input_features, height, width)]


def get_init_inputs():
    return [num_layers, num_input_features, growth_rate]
