"""Token counts for text no provider metered: kloop's own deterministic counter.

No real tokenizer can be used offline here (tiktoken and tokenizers download their vocabularies
at first use), so scripted replies that ask for counted usage are counted by this rule: words
split into pieces of at most 4 characters, each punctuation mark one token, whitespace free.
It lands near BPE counts for English and code, is the same on every machine, and is labelled
wherever it is used: counted, not provider-reported.
"""

from __future__ import annotations

import re

COUNTER = "kloop-approx-v1"
"""Name recorded with every count (`raw.scripted.usage_counted_by`), so reports can say so."""

_PIECES = re.compile(r"[A-Za-z]+|\d+|[^\sA-Za-z\d]")


def count_tokens(text: str) -> int:
    """Deterministic approximate token count of `text` (see the module docstring)."""
    return sum(-(-len(p) // 4) if p[0].isalnum() else 1 for p in _PIECES.findall(text))
