"""kloop installs under one import name. The folders at the top of the clone become
`kloop.agent`, `kloop.evaluator`, `kloop.problems` and `kloop.prompts`, and nothing else lands
at the top of site-packages, where a name like `evaluator` would collide with other packages.

The wheel is built from this clone and installed into a fresh venv outside it. kloop's
dependencies (torch and the rest) come from the test's own interpreter through a path line, so
the test installs nothing from a registry. There the commands run as a user would run them."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FOLDERS = {"kloop": "kloop", "agent": "kloop.agent", "evaluator": "kloop.evaluator",
           "problems": "kloop.problems", "prompts": "kloop.prompts"}


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")  # Python 3.11 on
    return tomllib.loads((REPO / "pyproject.toml").read_text())


def test_every_package_folder_is_installed_under_kloop():
    listed = set(_pyproject()["tool"]["setuptools"]["packages"])
    found = set()
    for folder, name in FOLDERS.items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder).parts
            found.add(".".join((name, *rel)))
    assert listed == found


def test_no_module_imports_a_top_level_name_of_ours():
    """A stray `import evaluator` would load a second copy of a module beside `kloop.evaluator`
    in a clone (two registries, two `EvalResult` classes), and fail in a wheel."""
    import ast

    ours = {"agent", "evaluator", "problems", "prompts"}
    offenders = []
    for folder in (*FOLDERS, "tests", "bench", "scripts", "examples"):
        for path in (REPO / folder).rglob("*.py"):
            if "level3" in path.parts:
                continue
            try:
                tree = ast.parse(path.read_text(), str(path))
            except SyntaxError:  # a broken candidate the tests submit on purpose
                continue
            for node in ast.walk(tree):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level \
                    else []
                offenders += [f"{path.relative_to(REPO)}: {n}" for n in names
                              if n.split(".")[0] in ours]
    assert not offenders


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A venv outside the clone with the wheel built from it installed (no dependencies)."""
    out = tmp_path_factory.mktemp("wheel")
    # Built from a copy: setuptools leaves build/ and egg-info in the tree it builds.
    src = out / "src"
    keep = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in FOLDERS:
        shutil.copytree(REPO / name, src / name, ignore=keep)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(out), str(src)], check=True, cwd=out)
    (wheel,) = out.glob("kloop-*.whl")
    env_dir = out / "venv"
    venv.create(env_dir, with_pip=False)
    python = env_dir / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()"
                           "['purelib'])"], capture_output=True, text=True, check=True)
    # The dependencies: this interpreter's site-packages, as a plain path (its .pth files, the
    # clone's editable install among them, are not processed from there).
    Path(site.stdout.strip(), "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install",
                    "--no-deps", "--no-index", "-q", str(wheel)], check=True, cwd=out)
    with zipfile.ZipFile(wheel) as z:
        tops = {n.split("/")[0] for n in z.namelist()}
    assert tops == {"kloop", wheel.name.split("-")[0] + "-" + wheel.name.split("-")[1]
                    + ".dist-info"}, tops
    return env_dir


def _run(env_dir: Path, *argv: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(env_dir / "bin" / argv[0]), *argv[1:]], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_the_built_wheel_installs_and_runs_outside_the_clone(installed, tmp_path):
    where = _run(installed, "python", "-c",
                 "import kloop, kloop.evaluator as e; print(e.__file__); import evaluator",
                 cwd=tmp_path)
    assert where.stdout.startswith(str(installed)), where.stdout
    assert "ModuleNotFoundError: No module named 'evaluator'" in where.stderr

    version = _run(installed, "kloop", "--version", cwd=tmp_path)
    assert version.returncode == 0 and version.stdout.strip(), version.stderr

    listed = _run(installed, "kloop", "problems", "list", "--level", "3", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "L3/1" in listed.stdout and "L3/50" in listed.stdout

    kernel = tmp_path / "mlp_triton.py"
    kernel.write_text((REPO / "tests/evaluator/candidates/mlp_triton.py").read_text())
    ev = _run(installed, "kloop", "eval", str(kernel), "--problem", "L3/1", "--device", "cpu",
              "--size", "small", "--json", cwd=tmp_path)
    assert ev.returncode == 0, (ev.stdout[-2000:], ev.stderr[-4000:])
    assert '"status":"correct"' in ev.stdout.replace(" ", "")
