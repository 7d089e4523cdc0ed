"""`kloop problems list` and `kloop problems show` through the real console script entry."""

import json
import shutil
import subprocess
import sys

from kloop.agent.cli import app
from kloop.problems.registry import BUNDLED_DIR
from typer.testing import CliRunner

runner = CliRunner()


def test_problems_list_shows_fifty_rows_with_metadata():
    result = runner.invoke(app, ["problems", "list", "--level", "3"])
    assert result.exit_code == 0, result.output
    assert "50 problems" in result.output
    assert "L3/50" in result.output and "50_ReLUSelfAttention" in result.output
    assert "62,556" in result.output and "4096x20" in result.output
    assert "degenerate@1e-4" in result.output


def test_problems_list_json_and_level_filter():
    rows = json.loads(runner.invoke(app, ["problems", "list", "--json"]).output)
    assert len(rows) == 50 and rows[3]["id"] == "L3/4" and rows[3]["params"] == 62_556
    assert json.loads(runner.invoke(app, ["problems", "list", "--level", "1", "--json"]).output) == []


def test_problems_list_external_dir(tmp_path):
    (tmp_path / "level1").mkdir()
    shutil.copy(BUNDLED_DIR / "level3" / "4_LeNet5.py", tmp_path / "level1" / "19_ReLU.py")
    result = runner.invoke(app, ["problems", "list", "--problems-dir", str(tmp_path)])
    assert result.exit_code == 0 and "L1/19" in result.output and "19_ReLU" in result.output


def test_problems_show_prints_source_and_metadata():
    result = runner.invoke(app, ["problems", "show", "L3/4"])
    assert result.exit_code == 0
    assert "4_LeNet5" in result.output and "class Model" in result.output and "62556" in result.output


def test_problems_show_unknown_id_fails_with_suggestions():
    result = runner.invoke(app, ["problems", "show", "LeNet5"])
    assert result.exit_code != 0
    assert "4_LeNet5" in result.output


def test_console_script_is_installed():
    exe = shutil.which("kloop") or str(__import__("pathlib").Path(sys.executable).parent / "kloop")
    out = subprocess.run([exe, "problems", "list"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "L3/1" in out.stdout
