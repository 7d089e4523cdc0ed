"""Dollar cost of a call from a versioned price table (agent/prices.json) that users can override.

Prices are USD per million tokens. Cached input is billed at `cached_input` (the input price
when the table gives none); reasoning tokens are part of output and billed as output. A model
missing from the table costs None, never 0: an unknown price must not look free in a budget.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

if TYPE_CHECKING:
    from kloop.agent.models.base import Usage

PACKAGED_PRICES = Path(__file__).with_name("prices.json")

# Dated snapshots ("gpt-5-2025-08-07", "claude-sonnet-4-5-20250929") bill like their alias.
_SNAPSHOT = re.compile(r"-(\d{4}-\d{2}-\d{2}|\d{8})$")


class ModelPrice(BaseModel):
    """USD per million tokens for one model."""

    model_config = ConfigDict(extra="forbid")

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cached_input: float | None = Field(None, ge=0)
    note: str | None = None


class PriceTable(BaseModel):
    """A dated list of prices; `version` is recorded so a cost can be traced to its prices."""

    model_config = ConfigDict(extra="forbid")

    version: str
    note: str = ""
    models: dict[str, ModelPrice]

    def lookup(self, model: str) -> ModelPrice | None:
        """The price of `model`, matching a vendor-prefixed or dated name to its base entry."""
        name = model.lower().rsplit("/", 1)[-1]
        for candidate in (name, _SNAPSHOT.sub("", name)):
            if candidate in self.models:
                return self.models[candidate]
        return None

    def cost_usd(self, model: str, usage: Usage) -> float | None:
        price = self.lookup(model)
        if price is None:
            return None
        cached = min(usage.cached_tokens, usage.input_tokens)
        cached_rate = price.input if price.cached_input is None else price.cached_input
        dollars = (
            (usage.input_tokens - cached) * price.input
            + cached * cached_rate
            + usage.output_tokens * price.output
        )
        return dollars / 1e6


@lru_cache(maxsize=8)
def _read_table(path: Path) -> PriceTable:
    try:
        return PriceTable.model_validate(json.loads(path.read_text()))
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read price table {path}: {e}") from e


def load_prices(override: dict[str, ModelPrice] | Path | None = None) -> PriceTable:
    """The packaged table; a path replaces it, a mapping overrides or adds single models."""
    if isinstance(override, Path):
        return _read_table(override.resolve())
    table = _read_table(PACKAGED_PRICES)
    if not override:
        return table
    models = dict(table.models)
    models.update({k.lower(): ModelPrice.model_validate(v) for k, v in override.items()})
    return PriceTable(version=f"{table.version}+user", note=table.note, models=models)
