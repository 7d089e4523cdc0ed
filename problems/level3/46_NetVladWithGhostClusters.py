import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, cluster_size, feature_size, ghost_clusters):
        """NetVLAD pooling with ghost clusters.

        Ghost clusters take part in the soft assignment (BatchNorm and softmax) but are dropped
        before the residuals are aggregated.

        :param cluster_size: number of (real) clusters K
        :param feature_size: feature dimension D
        :param ghost_clusters: number of ghost clusters G
        """
        super().__init__()
        self.feature_size = feature_size
        self.cluster_size = cluster_size
        self.ghost_clusters = ghost_clusters

        init_sc = 1 / math.sqrt(feature_size)
        clusters = cluster_size + ghost_clusters

        # Assignment weights (D, K+G), then BatchNorm over the K+G assignment logits, then the
        # cluster centres (1, D, K); this is also the order of the random draws.
        self.clusters = nn.Parameter(init_sc * torch.randn(feature_size, clusters))
        self.batch_norm = nn.BatchNorm1d(clusters)
        self.clusters2 = nn.Parameter(init_sc * torch.randn(1, feature_size, cluster_size))
        self.out_dim = self.cluster_size * feature_size

    def forward(self, x, mask=None):
        """
        :param x: descriptors of shape (batch_size, num_features, feature_size)
        :param mask: unused
        :return: VLAD descriptor of shape (batch_size, cluster_size * feature_size)
        """
        max_sample = x.size(1)
        x = x.view(-1, self.feature_size)  # (B*N, D)

        if x.device != self.clusters.device:
            raise ValueError(f"x.device {x.device} != cluster.device {self.clusters.device}")

        assignment = torch.matmul(x, self.clusters)  # (B*N, K+G)
        assignment = self.batch_norm(assignment)
        assignment = F.softmax(assignment, dim=1)
        assignment = assignment[:, : self.cluster_size]  # drop the ghost clusters
        assignment = assignment.view(-1, max_sample, self.cluster_size)  # (B, N, K)

        a_sum = torch.sum(assignment, dim=1, keepdim=True)  # (B, 1, K)
        a = a_sum * self.clusters2  # (B, D, K)

        assignment = assignment.transpose(1, 2)  # (B, K, N)
        x = x.view(-1, max_sample, self.feature_size)  # (B, N, D)
        vlad = torch.matmul(assignment, x)  # (B, K, D)
        vlad = vlad.transpose(1, 2)  # (B, D, K)
        vlad = vlad - a

        # Intra-normalisation over D, then flatten (row-major over (D, K)) and L2-normalise.
        vlad = F.normalize(vlad)
        vlad = vlad.reshape(-1, self.cluster_size * self.feature_size)
        vlad = F.normalize(vlad)
        return vlad


# Test configuration
batch_size = 2048
num_features = 100
num_clusters = 32
feature_size = 512
ghost_clusters = 16


def get_inputs():
    return [torch.rand(batch_size, num_features, feature_size)]


def get_init_inputs():
    return [num_clusters, feature_size, ghost_clusters]
