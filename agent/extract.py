"""Pull the kernel out of a reply: the last fenced python block.

A reply without one is a model fault (`NoKernelFound`); a block that cannot be the candidate
(unclosed fence, no `class ModelNew`) is a `FormatError`. Both become feedback and count as a
turn. Whether the code compiles is the evaluator's business, not this module's.
"""

from __future__ import annotations

import re

from kloop.agent.errors import FormatError, NoKernelFound

# A fence line: ``` or ~~~ (3 or more), optional language tag. Blocks may be indented (lists).
_FENCE = re.compile(r"^[ \t]*(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+.-]*)[^\n]*$", re.M)
_PYTHON_TAGS = {"python", "py", "python3", "py3"}
_MODELNEW = re.compile(r"^\s*class\s+ModelNew\b", re.M)


def _blocks(text: str) -> tuple[list[tuple[str, str]], str | None]:
    """All fenced blocks as (language tag, body), and the tag of a last fence left open."""
    blocks: list[tuple[str, str]] = []
    pos = 0
    while True:
        start = _FENCE.search(text, pos)
        if start is None:
            return blocks, None
        fence = start.group("fence")
        close = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$", re.M)
        end = close.search(text, start.end())
        if end is None:
            return blocks, start.group("lang").lower()
        body = text[start.end() + 1 : end.start()]
        blocks.append((start.group("lang").lower(), body))
        pos = end.end()


def extract_code(text: str, finish_reason: str | None = None) -> str:
    """Return the last python block of `text` (untagged blocks count when none is tagged)."""
    blocks, unclosed = _blocks(text)
    python = [body for lang, body in blocks if lang in _PYTHON_TAGS]
    candidates = python or [body for lang, body in blocks if lang == ""]
    # An open python block after complete ones is the newest version, cut off: not usable.
    if unclosed is not None and (unclosed in _PYTHON_TAGS or not candidates):
        why = " (the reply was cut off: finish_reason=length)" if finish_reason == "length" else ""
        raise FormatError(f"the last code block is never closed with ```{why}")
    if not candidates:
        if blocks:
            tags = ", ".join(sorted({lang or "untagged" for lang, _ in blocks}))
            raise NoKernelFound(f"the reply has code blocks ({tags}) but none in Python")
        raise NoKernelFound("the reply has no fenced ```python code block")
    code = candidates[-1].strip("\n") + "\n"
    if not _MODELNEW.search(code):
        raise FormatError("the last python code block does not define `class ModelNew`")
    return code
