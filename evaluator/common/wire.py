"""The call channel's wire format, shared by the harness (`evaluator.harness.clock`) and the
workers that serve calls (`evaluator.worker.serve`): the request and reply records, the status
codes, and where each output goes in the sealed shared memory. No side: plain data and the
one pipe read both ends use."""

from __future__ import annotations

import math
import os
import select
import struct
import time
from typing import Any

import torch
from pydantic import BaseModel, ConfigDict

OP_PREP, OP_CALL, OP_NULL, OP_STOP, OP_REST, OP_QUIET = 1, 2, 3, 4, 5, 6
PREP_LIGHT = 1
"""`OP_PREP`'s argument (in the seed field) before a null call: collect and synchronise only, no
busy phase and no L2 flush (a null call touches no model memory; it measures the channel)."""
REQUEST = struct.Struct("<BB6xQ")
"""op, role, seed."""
REPLY = struct.Struct("<B7xd")
"""status, the worker's own CUDA-event time of the forward in ms (NaN when none); for `quiet`,
the milliseconds it waited."""
OK, BAD_OUTPUT, RAISED, NOT_QUIET = 0, 1, 2, 3
_ALIGN = 4096
SPIN_S = 0.05
"""How long a wait spins before it sleeps (GPU only)."""
DTYPES: dict[str, torch.dtype] = {
    str(d): d for d in (torch.float32, torch.float16, torch.bfloat16, torch.float64,
                        torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8,
                        torch.bool, torch.complex64)
}


class Slot(BaseModel):
    model_config = ConfigDict(extra="forbid")

    shape: list[int]
    dtype: str
    offset: int
    nbytes: int


class ServeLayout(BaseModel):
    """Where each output of a call goes in the shared memory (the reference's outputs)."""

    model_config = ConfigDict(extra="forbid")

    slots: list[Slot]
    total: int

    @classmethod
    def of(cls, specs: list[tuple[list[int], str]]) -> ServeLayout:
        slots, offset = [], 0
        for shape, dtype in specs:
            if dtype not in DTYPES:
                raise ValueError(f"output dtype {dtype} cannot be served")
            n = math.prod(shape) * torch.empty((), dtype=DTYPES[dtype]).element_size()
            slots.append(Slot(shape=list(shape), dtype=dtype, offset=offset, nbytes=n))
            offset += -(-n // _ALIGN) * _ALIGN
        return cls(slots=slots, total=max(offset, _ALIGN))


def output_specs(outs: list[Any]) -> list[tuple[list[int], str]] | str:
    """(shape, dtype) of each output, or why these outputs cannot be served."""
    specs = []
    for i, o in enumerate(outs):
        if type(o) is not torch.Tensor:
            return f"output {i} is a {type(o).__qualname__}, not a plain torch.Tensor"
        specs.append((list(o.shape), str(o.dtype)))
    return specs


def read_exact(fd: int, n: int, spin_s: float = 0.0, deadline: float | None = None) -> bytes:
    """`n` bytes from a non-blocking pipe, spinning on reads for `spin_s` before sleeping in
    select (until `deadline`, a time.monotonic value; TimeoutError past it)."""
    data = b""
    spin_until = time.monotonic() + spin_s
    while len(data) < n:
        try:
            chunk = os.read(fd, n - len(data))
        except BlockingIOError:
            now = time.monotonic()
            if now < spin_until:
                continue
            left = None if deadline is None else deadline - now
            if left is not None and left <= 0:
                raise TimeoutError("no answer in time") from None
            select.select([fd], [], [], left)
            continue
        if not chunk:
            raise EOFError("the other end closed the call channel")
        data += chunk
    return data
