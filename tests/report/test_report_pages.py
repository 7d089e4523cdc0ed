"""`kloop report` end to end: Markdown, valid PNGs, one self-contained HTML page, JSON numbers."""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path

import pytest
import typer
from report_fixtures import T, write_run
from typer.testing import CliRunner

from kloop.agent.report_cli import register

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
REPO = Path(__file__).resolve().parents[2]


def app() -> typer.Typer:
    a = typer.Typer()
    register(a)
    return a


def png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC and data[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", data[16:24])


@pytest.fixture
def two_runs(tmp_path):
    a = write_run(tmp_path / "runA", ["L3/1", "L3/2", "L3/3"],
                  [T("L3/1", "incorrect"), T("L3/1", eager=1.8, compile=1.1), T("L3/2", "compile_error"),
                   T("L3/3", eager=3.0, compile=2.0, flags=("excessive_speedup",))])
    b = write_run(tmp_path / "runB", ["L3/1", "L3/2", "L3/3"],
                  [T("L3/1", eager=1.2, compile=0.9), T("L3/2", "rejected", rule="timing_patch")],
                  strategy={"samples": 2, "turns": 1})
    return a, b


def test_report_markdown_html_json(two_runs, tmp_path):
    out = tmp_path / "rep"
    result = CliRunner().invoke(app(), ["report", *map(str, two_runs), "--out", str(out), "--html", "--json",
                                        "--bootstrap", "200"])
    assert result.exit_code == 0, result.output

    md = (out / "report.md").read_text()
    for text in ("## Summary", "## Excluding degenerate problems", "## Per problem, side by side",
                 "## Run runA", "## Run runB", "L3/3 (degenerate)", "timing_patch 1", "excessive_speedup 1"):
        assert text in md, text
    images = re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md)
    assert len(images) == 4
    for name in images:
        w, h = png_size(out / name)
        assert 200 < w < 1200 and 100 < h < 800

    page = (out / "report.html").read_text()
    assert page.count('src="data:image/png;base64,') == 4
    assert "http://" not in page and "https://" not in page
    assert not re.search(r"<(script|link|iframe)\b|@import|url\(", page)
    assert re.findall(r'src="([^"]*)"', page) == [s for s in re.findall(r'src="([^"]*)"', page)
                                                    if s.startswith("data:image/png;base64,")]

    data = json.loads(result.stdout)
    assert data == json.loads((out / "report.json").read_text())
    run_a = data["runs"][0]
    assert run_a["label"] == "runA" and run_a["degenerate"] == ["L3/3"]
    fast = {f["p"]: f["vs_eager"]["value"] for f in run_a["metrics"]["fast_p"]}
    assert fast[1.0] == pytest.approx(2 / 3) and fast[2.0] == pytest.approx(1 / 3)
    assert run_a["metrics_excluding_degenerate"]["problems"] == 2
    axes = ["turns", "calls", "tokens", "dollars", "eval_s", "gpu_s", "wall_s"]
    assert [c["axis"] for c in run_a["curves"]] == axes
    # Its turns spent no GPU-seconds (written without them): no matched budget on that axis.
    assert {m["axis"] for m in data["matched"]} == set(axes) - {"gpu_s"}


def test_report_on_a_path_that_is_no_run(tmp_path):
    result = CliRunner().invoke(app(), ["report", str(tmp_path)])
    assert result.exit_code == 2
    assert "neither a run directory" in result.output


def test_bundled_example_run(tmp_path):
    examples = sorted(REPO.glob("runs/examples/*/config.json"))
    assert examples, "the bundled example run under runs/examples/ is missing"
    run = examples[0].parent
    out = tmp_path / "example-report"
    result = CliRunner().invoke(app(), ["report", str(run), "--out", str(out), "--html", "--bootstrap", "50"])
    assert result.exit_code == 0, result.output
    md = (out / "report.md").read_text()
    assert "## Summary" in md and (out / "report.html").is_file()


def test_plots_label_the_geomean_floor_and_never_repeat_a_speedup_tick(tmp_path, monkeypatch):
    from kloop.agent.report import plots
    from kloop.agent.report.curves import run_curves
    from kloop.agent.report.load import load_run
    from kloop.agent.report.metrics import problem_rows

    figures = []
    monkeypatch.setattr(plots, "_save", lambda fig, path, legend=False: figures.append(fig) or path)
    run = load_run(write_run(tmp_path / "r", ["L3/1", "L3/2", "L3/4", "L3/5"], [
        # Within a few percent of 1x: the log axis's own ticks all rounded to `1x`.
        T("L3/1", eager=0.98, compile=1.03), T("L3/2", eager=1.02, compile=0.97),
        T("L3/4", eager=1.01, compile=1.0), T("L3/5", eager=0.99, compile=1.02)]))
    plots.plot_speedups({"r": problem_rows(run)}, tmp_path / "s.png")
    plots.plot_curves(run_curves(run, "run"), ["r"], tmp_path / "c.png", "geomean")
    speed, curves = figures
    speed.canvas.draw()
    for ax in speed.axes:
        shown = [t.get_text() for t in ax.get_xticklabels(which="both") if t.get_text()]
        assert shown and len(shown) == len(set(shown)), shown
    # The first column of the 2 x 4 grid (seven budget axes, the last panel empty).
    assert all("max(1, speedup vs eager)" in ax.get_ylabel() for ax in curves.axes[::4])
