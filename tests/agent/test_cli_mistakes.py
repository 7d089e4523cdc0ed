"""Every command with the usual mistakes: one line on stderr, exit status 2, no traceback, and
nothing half-made left behind. `--debug` is the only way to see a traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from agent_fakes import FakeEvaluator, kernel, reply, run_kloop

from kloop.agent import components

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def fake_evaluator(monkeypatch):
    ev = FakeEvaluator()
    monkeypatch.setattr(components, "build_evaluator", lambda cfg, problems: ev)
    monkeypatch.setattr("kloop.agent.run.build_evaluator", lambda cfg, problems: ev)
    monkeypatch.setattr("kloop.agent.replay.build_evaluator", lambda cfg, problems: ev)
    return ev


@pytest.fixture
def source_run(tmp_path, fake_evaluator):
    script = tmp_path / "replies.yaml"
    script.write_text(yaml.safe_dump([reply(kernel(runtime_ms=0.5))] * 2))
    src = tmp_path / "src"
    res = run_kloop("run", "-p", "L3/1", "--model", f"scripted:{script}", "--turns", 2, "--out", src)
    assert res.exit_code == 0, res.output
    return src


def mistakes(tmp: Path, src: Path) -> list[tuple[list, str]]:
    (tmp / "latin1.py").write_bytes("# caf\xe9\nclass ModelNew: pass\n".encode("latin-1"))
    (tmp / "ok.py").write_text("class ModelNew:\n    pass\n")
    (tmp / "broken").mkdir(exist_ok=True)
    (tmp / "broken" / "task.j2").write_text("line one\n{% if problem %}\nnever closed\n")
    (tmp / "empty").mkdir(exist_ok=True)
    out = tmp / "out"
    return [
        (["run", "-p", "L3/1", "--model", "scripted:x", "--prompts-dir", tmp / "broken", "--out", out],
         "task.j2:2: broken template"),
        (["run", "-p", "L3/1", "--model", "scripted:x", "--prompts-dir", tmp / "empty", "--out", out],
         "holds no .j2 template"),

        (["run", "-p", "L3/1", "--model", "openai:gpt-5", "--out", out], "OPENAI_API_KEY"),
        (["run", "-p", "L3/1", "--model", "anthropic:claude-sonnet-4-5", "--out", out], "ANTHROPIC_API_KEY"),
        (["replay", src, "--fork-at", 1, "--model", "openai:gpt-5", "--out", out], "OPENAI_API_KEY"),
        (["run", "-p", "L3/1", "--model", "scripted:x", "--prompts-dir", tmp / "nope", "--out", out],
         "agent.prompts_dir"),
        (["run", "-p", "L3/1", "--model", "scripted:x", "--device", "gpu", "--out", out], "eval.device"),
        (["run", "-p", "L3/1", "--model", "scripted:x", "--policy", "lax", "--out", out], "lax"),
        (["run", "-p", "L3/999", "--model", "scripted:x", "--out", out], "L3/999"),
        (["run", "-p", "L3/1", "--model", "nosuch:x", "--out", out], "unknown model provider"),
        (["run", "-p", "L3/1", "--model", "scripted:x", "-c", "problem_overrides={L3/1: {foo: 2}}",
          "--out", out], "'foo'"),
        (["run", "--resume", tmp / "nope"], "not a run directory"),
        (["run", "--resume", src, "--turns", 3], "saved config"),
        (["eval", tmp / "latin1.py", "-p", "L3/1"], "UTF-8"),
        (["eval", tmp / "missing.py", "-p", "L3/1"], "cannot read"),
        (["eval", tmp / "ok.py", "-p", "L3/999"], "L3/999"),
        (["eval", tmp / "ok.py", "-p", "L3/1", "--set", "foo=2"], "'foo'"),
        (["eval", tmp / "ok.py", "-p", "L3/1", "--set", "foo"], "NAME=VALUE"),
        (["eval", tmp / "ok.py", "-p", "L3/1", "--device", "gpu"], "device must be"),
        (["eval", tmp / "ok.py", "-p", "L3/1", "--policy", "lax"], "lax"),
        (["eval", tmp / "ok.py", "-p", "L3/1", "--size", "tiny"], "--size"),
        (["baseline", "--level", 9], "no problems"),
        (["problems", "list", "--level", 9], "--problems-dir"),
        (["problems", "show", "L3/999"], "L3/999"),
        (["show", tmp / "nope"], "not a run directory"),
        (["report", tmp / "nope", "--out", out], "nope"),
        (["export", tmp / "nope", out], "nope"),
        (["import", "kernelbench", tmp / "nope", "--out", out], "not a folder"),
    ]


def test_every_command_fails_with_one_line(tmp_path, source_run, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.chdir(tmp_path)
    for args, needle in mistakes(tmp_path, source_run):
        before = sorted(p.name for p in tmp_path.iterdir())
        res = run_kloop(*args)
        shown = " ".join(map(str, args))
        assert res.exit_code == 2, f"kloop {shown}: exit {res.exit_code}\n{res.output}"
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: "), f"kloop {shown}:\n{res.stderr}"
        assert needle in lines[0], f"kloop {shown}: {lines[0]!r} lacks {needle!r}"
        assert "Traceback" not in res.output and "pydantic.dev" not in res.output
        assert sorted(p.name for p in tmp_path.iterdir()) == before, f"kloop {shown} left files"


@pytest.mark.no_ray_cluster  # another test's cluster up on the host would be found by `auto`
def test_ray_executor_without_a_cluster_is_one_line(tmp_path):
    pytest.importorskip("ray")
    script = tmp_path / "replies.yaml"
    script.write_text(yaml.safe_dump([reply(kernel())]))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"PYTHONPATH": str(REPO)}
    res = subprocess.run([sys.executable, "-m", "kloop", "run", "-p", "L3/1", "--model",
                          f"scripted:{script}", "--executor", "ray", "--ray-address", "auto",
                          "--out", str(tmp_path / "out")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1, res.stdout + res.stderr
    assert "Traceback" not in res.stderr and "--ray-address" in lines[0]
    assert "`--address`" not in lines[0] and not (tmp_path / "out").exists()


def test_debug_shows_the_traceback(tmp_path):
    with pytest.raises(Exception, match="no level-9 problems"):
        run_kloop("problems", "list", "--level", 9, "--debug")


def test_an_unknown_option_is_a_usage_error(tmp_path):
    res = run_kloop("run", "--no-such-flag")
    assert res.exit_code == 2 and "no-such-flag" in res.output and "Traceback" not in res.output


def test_help_and_version_are_fast_and_do_not_import_torch():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = time.monotonic()
    out = subprocess.run([sys.executable, "-X", "importtime", "-m", "kloop", "--help"], cwd=REPO,
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "Usage" in out.stdout
    assert " torch\n" not in out.stderr and "| torch" not in out.stderr
    assert time.monotonic() - start < 5  # well under a second on a quiet machine; CI is not one
    version = subprocess.run([sys.executable, "-m", "kloop", "--version"], cwd=REPO, env=env,
                             capture_output=True, text=True, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("kloop ")
    short = subprocess.run([sys.executable, "-m", "kloop", "run", "-h"], cwd=REPO, env=env,
                           capture_output=True, text=True, timeout=60)
    assert short.returncode == 0 and "--resume" in short.stdout


def test_ctrl_c_says_how_to_continue(tmp_path, fake_evaluator, monkeypatch):
    script = tmp_path / "replies.yaml"
    script.write_text(yaml.safe_dump([reply(kernel("BUG"))] * 3))
    calls = []

    def interrupt(problem, source):
        calls.append(source)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return FakeEvaluator().evaluate(problem, source)

    monkeypatch.setattr(fake_evaluator, "evaluate", interrupt)
    run = tmp_path / "run"
    res = run_kloop("run", "-p", "L3/1", "--model", f"scripted:{script}", "--turns", 3, "--out", run)
    assert res.exit_code == 130
    assert f"stopped; continue with: kloop run --resume {run}" in res.stderr
    assert "Traceback" not in res.output


def test_problems_show_prints_the_source_as_is():
    from kloop.problems.registry import get_problem

    res = run_kloop("problems", "show", "L3/4")
    assert res.exit_code == 0
    assert res.stdout == get_problem("L3/4").source  # copyable: no line numbers, no colour
    assert "L3/4" in res.stderr


def test_rescore_counts_no_llm_calls(tmp_path, source_run):
    out = tmp_path / "rescored"
    res = run_kloop("replay", source_run, "--rescore", "--out", out)
    assert res.exit_code == 0, res.output
    from kloop.agent.store import RunStore

    spend = RunStore.open(out).summary().spend
    assert (spend.calls, spend.total_tokens) == (0, 0) and spend.eval_s >= 0
    assert RunStore.open(source_run).summary().spend.calls == 2


def test_resume_with_a_prompts_dir_that_is_gone_is_one_line(tmp_path, fake_evaluator):
    prompts = tmp_path / "prompts"
    prompts.mkdir()
    (prompts / "system.j2").write_text("You write {{ backend }} kernels.\n")
    script = tmp_path / "replies.yaml"
    script.write_text(yaml.safe_dump([reply(kernel("BUG"))]))
    run = tmp_path / "run"
    res = run_kloop("run", "-p", "L3/1", "--model", f"scripted:{script}", "--turns", 2,
                    "--prompts-dir", prompts, "--out", run)
    assert res.exit_code == 0, res.output  # the script runs out after one turn: resumable
    (prompts / "system.j2").unlink()
    prompts.rmdir()
    res = run_kloop("run", "--resume", run)
    assert res.exit_code == 2 and res.stderr.count("\n") == 1
    assert "prompts_dir" in res.stderr and "is not a folder" in res.stderr
