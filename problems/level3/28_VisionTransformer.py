import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, channels=3, dropout=0.1,
                 emb_dropout=0.1):
        """Vision Transformer: patch embedding, class token, transformer encoder, MLP head.

        :param image_size: input image size (square)
        :param patch_size: patch size (must divide image_size)
        :param num_classes: number of output classes
        :param dim: embedding dimension
        :param depth: number of encoder layers
        :param heads: number of attention heads
        :param mlp_dim: hidden size of the encoder feed-forward and of the head
        :param channels: number of input channels
        :param dropout: dropout rate inside the encoder and head
        :param emb_dropout: dropout rate applied to the embeddings
        """
        super().__init__()

        assert image_size % patch_size == 0, "Image dimensions must be divisible by the patch size."
        num_patches = (image_size // patch_size) ** 2
        patch_dim = channels * patch_size ** 2

        self.patch_size = patch_size
        self.pos_embedding = nn.Parameter(torch.randn(1, num_patches + 1, dim))
        self.patch_to_embedding = nn.Linear(patch_dim, dim)
        self.cls_token = nn.Parameter(torch.randn(1, 1, dim))
        self.dropout = nn.Dropout(emb_dropout)

        # Quirk kept from the reference: batch_first=False although the input is batch-first,
        # and all `depth` layers are deep copies of one initialised layer.
        self.transformer = nn.TransformerEncoder(
            nn.TransformerEncoderLayer(d_model=dim, nhead=heads, dim_feedforward=mlp_dim, dropout=dropout),
            num_layers=depth,
        )

        self.to_cls_token = nn.Identity()
        self.mlp_head = nn.Sequential(
            nn.Linear(dim, mlp_dim),
            nn.GELU(),
            nn.Dropout(dropout),
            nn.Linear(mlp_dim, num_classes),
        )

    def forward(self, img):
        """
        :param img: input of shape (batch_size, channels, image_size, image_size)
        :return: logits of shape (batch_size, num_classes)
        """
        p = self.patch_size

        # Quirk kept from the reference: the row-major flattening of (c, i, j, u, v) is cut into
        # chunks of p*p*C, so a "patch vector" is not one patch over all channels.
        x = img.unfold(2, p, p).unfold(3, p, p).reshape(img.shape[0], -1, p * p * img.shape[1])
        x = self.patch_to_embedding(x)

        cls_tokens = self.cls_token.expand(img.shape[0], -1, -1)
        x = torch.cat((cls_tokens, x), dim=1)
        x += self.pos_embedding
        x = self.dropout(x)

        # Interpreted by the encoder as (seq=batch, batch=tokens, dim).
        x = self.transformer(x)

        x = self.to_cls_token(x[:, 0])
        return self.mlp_head(x)


# Test configuration
image_size = 224
patch_size = 16
num_classes = 10
dim = 512
depth = 6
heads = 8
mlp_dim = 2048
channels = 3
dropout = 0.0
emb_dropout = 0.0


def get_inputs():
    return [torch.rand(2, channels, image_size, image_size)]


def get_init_inputs():
    return [image_size, patch_size, num_classes, dim, depth, heads, mlp_dim, channels, dropout, emb_dropout]
