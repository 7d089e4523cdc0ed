"""Config: files and key=value overrides merged recursively, unknown keys refused, stable digest."""

from __future__ import annotations

import pytest

from kloop.agent.config import ConfigError, RunConfig, load_config


def test_files_overrides_and_flags_merge_in_order(tmp_path):
    exp = tmp_path / "exp.yaml"
    exp.write_text("model:\n  spec: openai:gpt-5\n  temperature: 0.2\nstrategy:\n  turns: 8\n"
                   "budget:\n  run:\n    cost_usd: 5\n")
    cfg = load_config([str(exp), "strategy.samples=4", "model.temperature=0.7", "agent.context=last"],
                      {"problems": ["L3/4"], "budget": {"episode": {"calls": 3}}})
    assert cfg.model.spec == "openai:gpt-5" and cfg.model.temperature == 0.7
    assert (cfg.strategy.kind, cfg.strategy.turns, cfg.strategy.samples) == ("grid", 8, 4)
    assert cfg.budget.run.cost_usd == 5 and cfg.budget.episode.calls == 3
    assert cfg.agent.context == "last" and cfg.problems == ["L3/4"]


def test_unknown_keys_and_bad_values_name_the_key(tmp_path):
    with pytest.raises(ConfigError, match=r"strategy.turnz: Extra inputs are not permitted"):
        load_config(["strategy.turnz=3", "model.spec=scripted:x"])
    with pytest.raises(ConfigError, match=r"agent.context: Input should be"):
        load_config(["agent.context=everything", "model.spec=scripted:x"])
    with pytest.raises(ConfigError, match="no such file"):
        load_config(["missing.yaml"])
    with pytest.raises(ConfigError, match=r"model: Field required"):
        load_config([])


def test_a_removed_evaluator_setting_is_refused_by_name_and_old_run_configs_still_load(tmp_path):
    """Mechanism settings removed on 2026-12-05 (`evaluator.common.config.REMOVED`): an experiment file
    that names one is refused as an unknown key is, saying why; a run saved before the removal
    (its config.json holds all six at their defaults) still reads, and starts again."""
    from pathlib import Path

    from kloop.agent.store import RunConfigRecord

    exp = tmp_path / "exp.yaml"
    exp.write_text("model:\n  spec: scripted:x\neval:\n  jit_warmup: auto\n")
    with pytest.raises(ConfigError, match=r"eval: jit_warmup was removed on 2026-12-05"):
        load_config([str(exp)])
    with pytest.raises(ConfigError, match=r"eval: device_lock was removed"):
        load_config(["model.spec=scripted:x", "eval.device_lock=host"])
    saved = (Path(__file__).resolve().parents[2] / "runs" / "examples" / "search-h200" / "cells"
             / "base__1x4__base__base__seed0" / "config.json")
    assert '"jit_warmup"' in saved.read_text() and '"eager_baseline_from"' in saved.read_text()
    record = RunConfigRecord.model_validate_json(saved.read_text())
    assert record.config.eval.device == "cuda"
    assert load_config([str(saved)]).eval == record.config.eval


def test_saved_config_json_round_trips_and_the_digest_ignores_where_it_runs(tmp_path):
    from kloop.agent.store import RunStore

    cfg = load_config(["model.spec=scripted:x", "problems=[L3/1]", "strategy.turns=2"])
    store = RunStore.create(tmp_path / "r", cfg)
    again = load_config([str(store.root / "config.json")])
    assert again == cfg and store.config_record().digest == cfg.digest()
    assert load_config([str(store.root / "config.json"), "run_id=x"]).run_id == "x"
    moved = cfg.model_copy(update={"runs_dir": tmp_path, "run_id": "x", "concurrency": 9,
                                   "problems": ["L3/2"]})
    assert moved.digest() == cfg.digest()
    # How many builds run at once and what builds may not open change no episode either.
    started = cfg.model_copy(update={"eval": cfg.eval.model_copy(update={
        "hidden_from_builds": ["/dev/x"], "build_slots": 3})})
    assert started.digest() == cfg.digest()
    assert load_config(["model.spec=scripted:x", "strategy.turns=3"]).digest() != cfg.digest()


def test_strategy_defaults_follow_the_kind():
    def strat(**kw):
        return RunConfig(model={"spec": "x:y"}, strategy=kw).strategy

    assert (strat().kind, strat().turns, strat().samples) == ("sequential", 4, 1)
    assert (strat(kind="best_of_n").samples, strat(kind="best_of_n").turns) == (4, 1)
    assert strat(samples=3).kind == "best_of_n"
    assert strat(kind="beam").turns == 1
