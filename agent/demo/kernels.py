"""The scripted candidate kernels of the bundled example runs (written for kloop, not by a model).

Five Level 3 problems of different families, each as a `ModelNew` with the reference's parameter
layout and a Triton kernel doing part of the work. Every problem has the same five variants, the
kinds of reply a model gives: `syntax` (does not parse), `crash` (a wrong kernel launch), `wrong`
(a plausible bug with wrong outputs), `ok` and `ok_fast` (correct; the second with larger tiles or
fewer copies). Sizes are the examples' small ones (see `SIZES`), so the Triton interpreter can
judge them on a CPU in seconds.
"""

from __future__ import annotations

from typing import Literal

Variant = Literal["syntax", "crash", "wrong", "ok", "ok_fast"]

SIZES: dict[str, dict] = {
    "L3/1": {"batch_size": 4, "input_size": 48, "layer_sizes": [48, 48], "output_size": 16},
    "L3/4": {"batch_size": 4},
    "L3/13": {"batch_size": 2, "num_input_features": 8, "num_output_features": 16,
              "height": 16, "width": 16},
    "L3/17": {"batch_size": 2, "expand1x1_channels": 8, "expand3x3_channels": 8,
              "height": 16, "width": 16},
    "L3/43": {"batch_size": 2, "seq_len": 16, "max_seqlen": 16, "n_embd": 32, "n_head": 4},
}
FAMILY = {"L3/1": "MLP", "L3/4": "CNN (LeNet-5)", "L3/13": "BatchNorm + conv + pool (DenseNet)",
          "L3/17": "multi-branch conv (SqueezeNet fire)", "L3/43": "causal self-attention (minGPT)"}

_IMPORTS = """import math

import torch
import torch.nn as nn
import torch.nn.functional as F
import triton
import triton.language as tl
"""

_RELU = """

@triton.jit
def relu_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, tl.maximum(x, 0.0), mask=mask)


def relu(x):
    x = x.contiguous()
    out = torch.empty_like(x)
    n = x.numel()
    relu_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK)
    return out
"""

_SOFTMAX = """

@triton.jit
def causal_softmax_kernel(x_ptr, out_ptr, T, scale, BLOCK: tl.constexpr):
    # One program per (batch, head, query) row of the T x T score matrix.
    row = tl.program_id(0)
    query = row % T
    cols = tl.arange(0, BLOCK)
    valid = (cols < T) & (cols <= query)
    x = tl.load(x_ptr + row * T + cols, mask=valid, other=-float("inf")) * scale
    x = x - tl.max(x, axis=0)
    e = tl.where(valid, tl.exp(x), 0.0)
    tl.store(out_ptr + row * T + cols, e / tl.sum(e, axis=0), mask=cols < T)
"""

_MODELS = {
    "L3/1": """

class ModelNew(nn.Module):
    def __init__(self, input_size, layer_sizes, output_size):
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
        for layer in self.network:
            x = relu(x) if isinstance(layer, nn.ReLU) else layer(x)
        return x
""",
    "L3/4": """

class ModelNew(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels=1, out_channels=6, kernel_size=5, stride=1)
        self.conv2 = nn.Conv2d(in_channels=6, out_channels=16, kernel_size=5, stride=1)
        self.fc1 = nn.Linear(in_features=16 * 5 * 5, out_features=120)
        self.fc2 = nn.Linear(in_features=120, out_features=84)
        self.fc3 = nn.Linear(in_features=84, out_features=num_classes)

    def forward(self, x):
        x = F.max_pool2d(relu(self.conv1(x)), kernel_size=2, stride=2)
        x = F.max_pool2d(relu(self.conv2(x)), kernel_size=2, stride=2)
        x = x.reshape(x.shape[0], -1)
        x = relu(self.fc1(x))
        x = relu(self.fc2(x))
        return self.fc3(x)
""",
    "L3/13": """

class ModelNew(nn.Module):
    def __init__(self, num_input_features, num_output_features):
        super().__init__()
        self.transition = nn.Sequential(
            nn.BatchNorm2d(num_input_features),
            nn.ReLU(inplace=True),
            nn.Conv2d(num_input_features, num_output_features, kernel_size=1, bias=False),
            nn.AvgPool2d(kernel_size=2, stride=2),
        )

    def forward(self, x):
        bn, _, conv, pool = self.transition
        return pool(conv(relu(bn(x))))
""",
    "L3/17": """

class ModelNew(nn.Module):
    def __init__(self, in_channels, squeeze_channels, expand1x1_channels, expand3x3_channels):
        super().__init__()
        self.squeeze = nn.Conv2d(in_channels, squeeze_channels, kernel_size=1)
        self.squeeze_activation = nn.ReLU(inplace=True)
        self.expand1x1 = nn.Conv2d(squeeze_channels, expand1x1_channels, kernel_size=1)
        self.expand1x1_activation = nn.ReLU(inplace=True)
        self.expand3x3 = nn.Conv2d(squeeze_channels, expand3x3_channels, kernel_size=3, padding=1)
        self.expand3x3_activation = nn.ReLU(inplace=True)

    def forward(self, x):
        x = relu(self.squeeze(x))
        return torch.cat([relu(self.expand1x1(x)), relu(self.expand3x3(x))], 1)
""",
    "L3/43": """

class ModelNew(nn.Module):
    def __init__(self, n_embd, n_head, attn_pdrop, resid_pdrop, max_seqlen):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout = nn.Dropout(attn_pdrop)
        self.resid_dropout = nn.Dropout(resid_pdrop)
        mask = torch.tril(torch.ones(max_seqlen, max_seqlen))
        self.register_buffer("bias", mask.view(1, 1, max_seqlen, max_seqlen))
        self.n_head = n_head
        self.n_embd = n_embd

    def forward(self, x):
        B, T, C = x.size()
        hs = C // self.n_head
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, hs).transpose(1, 2)
        k = k.view(B, T, self.n_head, hs).transpose(1, 2)
        v = v.view(B, T, self.n_head, hs).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)).contiguous()
        att = torch.zeros_like(scores)
        causal_softmax_kernel[(B * self.n_head * T,)](scores, att, T, 1.0 / math.sqrt(hs),
                                                      BLOCK=triton.next_power_of_2(T))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))
""",
}

# The bug each problem's `wrong` variant makes: (text in the correct source, its replacement).
_BUGS = {
    "L3/1": ("x = relu(x) if isinstance(layer, nn.ReLU) else layer(x)",
             "x = relu(layer(x)) if isinstance(layer, nn.Linear) else x"),
    "L3/4": ("return self.fc3(x)", "return relu(self.fc3(x))"),
    "L3/13": ("return pool(conv(relu(bn(x))))", "return pool(relu(conv(bn(x))))"),
    "L3/17": ("[relu(self.expand1x1(x)), relu(self.expand3x3(x))]",
              "[relu(self.expand3x3(x)), relu(self.expand1x1(x))]"),
    "L3/43": ("valid = (cols < T) & (cols <= query)", "valid = cols < T"),
}
_CRASH = {
    "relu": ("relu_kernel[(triton.cdiv(n, BLOCK),)](x, out, n, BLOCK=BLOCK)",
             "relu_kernel[(triton.cdiv(n, BLOCK),)](x, out, BLOCK=BLOCK)"),
    "softmax": ("(scores, att, T, 1.0 / math.sqrt(hs),", "(scores, att, 1.0 / math.sqrt(hs),"),
}
_SYNTAX = {
    "relu": ("tl.maximum(x, 0.0), mask=mask)", "tl.maximum(x, 0.0, mask=mask)"),
    "softmax": ("e / tl.sum(e, axis=0), mask=cols < T)", "e / tl.sum(e, axis=0, mask=cols < T)"),
}

NOTES: dict[Variant, str] = {
    "syntax": "I fuse the activation into a Triton kernel and keep the rest of the model as is.",
    "crash": "Same plan: the activation in Triton, one program per block of elements.",
    "wrong": "Moving the elementwise work into Triton; the layer structure is unchanged.",
    "ok": "The elementwise work runs in a Triton kernel; the parameters keep the reference layout.",
    "ok_fast": "Same kernel with larger tiles (fewer programs) and no extra copies.",
}


def source(problem_id: str, variant: Variant) -> str:
    """The candidate file of `problem_id` in `variant`."""
    kind = "softmax" if problem_id == "L3/43" else "relu"
    block = "\nBLOCK = 2048\n" if variant == "ok_fast" else "\nBLOCK = 256\n"
    text = _IMPORTS + (block if kind == "relu" else "") + (_RELU if kind == "relu" else _SOFTMAX)
    text += _MODELS[problem_id]
    if kind == "softmax" and variant == "ok_fast":
        text = text.replace("att = torch.zeros_like(scores)", "att = torch.empty_like(scores)")
    swaps = {"syntax": _SYNTAX[kind], "crash": _CRASH[kind], "wrong": _BUGS[problem_id]}
    if variant in swaps:
        old, new = swaps[variant]
        assert old in text, (problem_id, variant)
        text = text.replace(old, new)
    return text


def reply(problem_id: str, variant: Variant) -> str:
    """A reply in the shape models give: a sentence of plan, then the code block."""
    return f"{NOTES[variant]}\n\n```python\n{source(problem_id, variant)}```\n"
