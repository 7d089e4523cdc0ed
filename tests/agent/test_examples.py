"""The experiment and sweep files of the README and docs/experiments.md: committed, shown whole,
valid."""

from __future__ import annotations

from pathlib import Path

import pytest
from kloop.agent.config import load_config
from kloop.agent.models.base import Usage
from kloop.agent.pricing import load_prices
from kloop.agent.sweep import plan

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


@pytest.mark.parametrize("doc", ["README.md", "docs/experiments.md"])
def test_the_doc_shows_each_example_file_whole(doc):
    text = (REPO / doc).read_text()
    for name in ("experiment.yaml", "sweep.yaml"):
        assert f"```yaml\n{(EXAMPLES / name).read_text().rstrip()}\n```" in text, name


def test_the_experiment_loads_and_prices_a_model_missing_from_the_table():
    cfg = load_config([str(EXAMPLES / "experiment.yaml")])
    assert cfg.problems == ["L3/1", "L3/4"] and cfg.budget.run.cost_usd == 5.0
    assert load_prices().lookup("my-proxy-model") is None  # not in the packaged table
    table = load_prices(cfg.model.prices)
    assert table.cost_usd("my-proxy-model", Usage(input_tokens=10**6, output_tokens=10**6)) == 2.0


def test_the_sweep_expands_to_its_cells():
    cells = plan(EXAMPLES / "sweep.yaml")
    assert len(cells) == 2 * 2 * 3 * 2
    assert {c.axes["budget"] for c in cells} == {"calls8", "calls16", "calls16-5usd"}
    first = cells[0]
    assert first.cell_id == "base__seq__full__base__calls8__seed0"
    assert first.config.budget.run.calls == 8 and first.config.budget.episode.calls is None
    assert first.config.model.spec == "openai:my-proxy-model"  # from `configs:`
