"""Secret positions of a large output, the same in the reference worker and the harness.

The precision check compares outputs with a float64 run of the reference. For an output past
`Policy.precision_sample_above` elements the reference worker keeps its float64 values only at
`Sample.size` positions drawn from a secret seed, and the harness takes the fp32 outputs (the
candidate's and the reference's) at the same positions. Why: each float64 output is twice the
fp32 output, and an evaluation made four (trial 0 and three timed calls); L3/17's 4.3 GB output
made 34 GB of them per evaluation, on disk and then in the harness's memory. The check's
measure, a relative RMS error, is a mean over elements: a million of them estimate it to well
within the factor of 100 it is judged by, and a candidate that cannot see the positions cannot
lower its precision only elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from kloop.evaluator.common.protocol import Sample


def positions(seed: int, numel: int, size: int) -> torch.Tensor:
    """`size` positions in [0, numel), drawn with replacement from `seed` (CPU, int64)."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, numel, (size,), generator=gen)


def sampled(sample: Sample | None, k: int, x: Any) -> bool:
    """Whether output `k` is kept at positions only: a floating tensor past the threshold."""
    return sample is not None and isinstance(x, torch.Tensor) and x.is_floating_point() and \
        x.numel() > sample.above


def take(sample: Sample, k: int, x: torch.Tensor) -> torch.Tensor:
    """Output `k`'s values at its positions, on its device (1-D)."""
    pos = positions(sample.seed + k, x.numel(), sample.size).to(x.device)
    return x.reshape(-1)[pos]


def reduce(sample: Sample | None, outs: list[Any]) -> tuple[list[Any], dict[str, list]]:
    """Every output kept whole or at its positions, with what the harness needs to pair them:
    which were sampled and each one's element count."""
    flags = [sampled(sample, k, x) for k, x in enumerate(outs)]
    numels = [x.numel() if isinstance(x, torch.Tensor) else None for x in outs]
    kept = [take(sample, k, x) if f else x  # type: ignore[arg-type]
            for k, (x, f) in enumerate(zip(outs, flags, strict=True))]
    return kept, {"sampled": flags, "numels": numels}


@dataclass
class Float64Outputs:
    """A call's float64 outputs as the reference worker wrote them: each whole, or at the
    positions of `sample` where `sampled` says so (of an output of `numels[k]` elements)."""

    outputs: list[Any]
    sampled: list[bool]
    numels: list[int | None]
    sample: Sample | None

    @classmethod
    def load(cls, data: Any, sample: Sample | None) -> Float64Outputs:
        """From a worker's file: `{"outputs": [...], "sampled": [...], "numels": [...]}`."""
        outs = list(data["outputs"])
        flags = [bool(f) for f in data["sampled"]]
        numels = list(data["numels"])
        if not len(flags) == len(numels) == len(outs) or (any(flags) and sample is None):
            raise ValueError("float64 outputs that do not match their sample")
        return cls(outs, flags, numels, sample)

    @property
    def positions(self) -> int | None:
        """How many positions the sampled outputs kept; None: every output whole."""
        return self.sample.size if self.sample is not None and any(self.sampled) else None

    def pair(self, k: int, x: Any) -> Any:
        """The fp32 output `x` (the k-th) as it is compared with float64 output k: at the same
        positions where that one was sampled, else whole. One of another element count is
        returned as it is, and its shape then differs from the sampled one's."""
        if k < len(self.sampled) and self.sampled[k] and isinstance(x, torch.Tensor) and \
                x.numel() == self.numels[k]:
            assert self.sample is not None
            return take(self.sample, k, x)
        return x
