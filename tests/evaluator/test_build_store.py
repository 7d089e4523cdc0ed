"""The build store candidates cannot write: children build privately, the
harness installs what they built under the hash of the candidate file and stages verified,
read-only copies for that file only. Each attack here is the cheapest we found against one part
of the defence; every child below is confined as a real one is (no capabilities when root).

Real builds: a pybind11-only C++ `load_inline` extension (CPU torch builds it in seconds), and
the real child-side code (`candidate._install_build_cache`, `child.import_candidate`).
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from kloop.evaluator.build import buildcache, buildstore
from kloop.evaluator.common import linux
from kloop.evaluator.procs import isolation

REPO = Path(__file__).resolve().parents[2]
EXT = """#include <pybind11/pybind11.h>
int twice(int x) { return 2 * x; }
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("twice", &twice); }
"""
PAYLOAD = EXT.replace("2 * x", "3 * x")

HONEST = f'''from torch.utils.cpp_extension import load_inline

EXT = {EXT!r}
ext = load_inline(name="kloop_store_twice", cpp_sources=EXT, no_implicit_headers=True)
VALUE = ext.twice(21)
'''

# Builds a payload under the module name the honest file loads, then plants it wherever it can
# for the honest file's call: the key is computed with the cache code in its own process, and it
# is assumed to know the honest file byte for byte.
ATTACKER = f'''import hashlib, json, os, shutil
from pathlib import Path
from torch.utils.cpp_extension import load_inline
from kloop.evaluator.build import buildcache

HONEST = {HONEST!r}
PAYLOAD = {PAYLOAD!r}
ext = load_inline(name="kloop_store_twice", cpp_sources=PAYLOAD, no_implicit_headers=True)
mine = Path(buildcache.BUILD_RECORDS[-1].path)
st = buildcache._state
args = buildcache._bind(st.real, (), dict(name="kloop_store_twice", cpp_sources={EXT!r},
                                          no_implicit_headers=True))
key = buildcache.build_key(args, st.arch, hashlib.sha256(HONEST.encode()).hexdigest())
ATTACKS = {{}}

def attempt(name, action):
    try:
        action()
        ATTACKS[name] = "done"
    except OSError as e:
        ATTACKS[name] = type(e).__name__

honest_ext = Path(os.environ["KLOOP_TEST_HONEST_EXT"])
store_entry = Path(os.environ["KLOOP_TEST_STORE_ENTRY"])
so = mine / "kloop_store_twice.so"
attempt("own_private_dir", lambda: shutil.copytree(mine, st.cache_root / key))
attempt("own_verified_dir", lambda: shutil.copytree(mine, st.verified_root / key))
attempt("honest_staged_so", lambda: shutil.copyfile(so, honest_ext / key / so.name))
attempt("honest_staged_dir", lambda: shutil.copytree(mine, honest_ext / ("0" * 64)))
attempt("store_so", lambda: shutil.copyfile(so, store_entry / so.name))
attempt("store_manifest", lambda: (store_entry / "manifest.json").write_text("{{}}"))
attempt("chmod_staged", lambda: os.chmod(honest_ext, 0o777))
VALUE = ext.twice(21)
'''

CHILD = """
import json, sys
from kloop.evaluator.build import buildcache
from kloop.evaluator.worker.confine import confine_child
from kloop.evaluator.worker.candidate import _install_build_cache
from kloop.evaluator.worker.child import import_candidate
confine_child()
_install_build_cache(sys.argv[1], sys.argv[2], check_only=False)
mod = import_candidate(sys.argv[2])
rec = buildcache.BUILD_RECORDS[-1]
print(json.dumps({"value": mod.VALUE, "record": rec.model_dump(mode="json"),
                  "attacks": getattr(mod, "ATTACKS", {})}))
"""


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def child(verified: Path, candidate: Path, **env: str) -> dict:
    """A compile or candidate child's build set-up, confined like one (as root: no caps)."""
    full = {**os.environ, "PYTHONPATH": str(REPO), **env}
    if os.geteuid() == 0:
        full[linux.CONFINE_ENV] = "caps"
    out = subprocess.run([sys.executable, "-c", CHILD, str(verified), str(candidate)],
                         cwd=REPO, env=full, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def evaluation(root: Path, source: str) -> dict[str, Path]:
    """The dirs of one evaluation: the compile and candidate children's, and the staged builds."""
    dirs = {name: root / name for name in ("compile", "cand")}
    for d in dirs.values():
        d.mkdir(parents=True)
        (d / "candidate.py").write_text(source)
    return {**dirs, "ext": root / "ext"}


def compile_and_install(ev: dict[str, Path], store: Path, source: str, **env: str) -> dict:
    """What the compile stage does: stage, run the compile child, install, stage again."""
    buildstore.stage(store, sha(source), ev["ext"], None)
    out = child(ev["ext"], ev["compile"] / "candidate.py", **env)
    buildstore.install(ev["compile"] / "build", store, sha(source))
    buildstore.stage(store, sha(source), ev["ext"], None)
    return out


@pytest.fixture
def store(tmp_path) -> Path:
    return buildstore.store_root(tmp_path / "cache")


@pytest.mark.slow
def test_a_planted_payload_never_reaches_the_honest_file(tmp_path, store):
    honest = evaluation(tmp_path / "honest", HONEST)
    first = compile_and_install(honest, store, HONEST)
    assert first["value"] == 42 and first["record"]["cache_hit"] is False
    [key] = os.listdir(store / sha(HONEST))
    manifest = buildstore.BuildManifest.model_validate_json(
        (store / sha(HONEST) / key / buildstore.MANIFEST).read_text())
    assert manifest.files == {"kloop_store_twice.so": hashlib.sha256(
        (honest["ext"] / key / "kloop_store_twice.so").read_bytes()).hexdigest()}

    # The candidate child of the honest file loads the verified copy, read-only.
    hit = child(honest["ext"], honest["cand"] / "candidate.py")
    assert hit["value"] == 42 and hit["record"]["cache_hit"] is True
    assert hit["record"]["path"] == str(honest["ext"] / key)

    attacker = evaluation(tmp_path / "attacker", ATTACKER)
    out = compile_and_install(attacker, store, ATTACKER,
                              KLOOP_TEST_HONEST_EXT=str(honest["ext"]),
                              KLOOP_TEST_STORE_ENTRY=str(store / sha(HONEST) / key))
    assert out["value"] == 63
    # Its own private dir takes anything; all it ever feeds is its own file's namespace.
    assert out["attacks"]["own_private_dir"] == "done"
    if os.geteuid() == 0:
        denied = {k: v for k, v in out["attacks"].items() if k != "own_private_dir"}
        assert set(denied.values()) == {"PermissionError"}, out["attacks"]
    assert key in os.listdir(store / sha(ATTACKER))
    assert os.listdir(store / sha(HONEST)) == [key]

    # A later evaluation of the honest file still gets its own build.
    again = evaluation(tmp_path / "honest2", HONEST)
    assert buildstore.stage(store, sha(HONEST), again["ext"], None) == [key]
    later = child(again["ext"], again["cand"] / "candidate.py")
    assert later["value"] == 42 and later["record"]["cache_hit"] is True


@pytest.mark.slow
def test_a_store_entry_that_fails_its_manifest_is_dropped_and_rebuilt(tmp_path, store):
    honest = evaluation(tmp_path / "honest", HONEST)
    compile_and_install(honest, store, HONEST)
    [key] = os.listdir(store / sha(HONEST))
    attacker = evaluation(tmp_path / "attacker", ATTACKER)
    compile_and_install(attacker, store, ATTACKER, KLOOP_TEST_HONEST_EXT=str(tmp_path / "x"),
                        KLOOP_TEST_STORE_ENTRY=str(tmp_path / "x"))
    # Whatever got into the store (here: the harness's own hand) fails verification when staged.
    payload = store / sha(ATTACKER) / key / "kloop_store_twice.so"
    target = store / sha(HONEST) / key / "kloop_store_twice.so"
    target.write_bytes(payload.read_bytes())
    again = evaluation(tmp_path / "honest2", HONEST)
    assert buildstore.stage(store, sha(HONEST), again["ext"], None) == []
    assert not (store / sha(HONEST) / key).exists()
    rebuilt = child(again["ext"], again["cand"] / "candidate.py")
    assert rebuilt["value"] == 42 and rebuilt["record"]["cache_hit"] is False


def fake_build(entry: Path, module: str = "m", so_bytes: bytes = b"\x7fELF not really") -> None:
    entry.mkdir(parents=True)
    (entry / buildcache.META_FILE).write_text(json.dumps(
        {"module": module, "so": f"{module}.so", "is_python_module": True}))
    (entry / f"{module}.so").write_bytes(so_bytes)


def test_install_copies_plain_files_only(tmp_path, store):
    """A child controls every byte and inode of its build dir: links, FIFOs, odd names and
    lying metadata install nothing (and never block or read outside it)."""
    secret = tmp_path / "secret"
    secret.write_bytes(b"root-only")
    secret.chmod(0o600)
    build = tmp_path / "build"
    keys = iter(hashlib.sha256(bytes([i])).hexdigest() for i in range(100))

    fake_build(tmp_path / "elsewhere")
    (build).mkdir()
    os.symlink(tmp_path / "elsewhere", build / next(keys))  # the entry is a link
    fake_build(entry := build / next(keys))
    (entry / "m.so").unlink()
    os.symlink(secret, entry / "m.so")  # the .so is a link to a secret
    fake_build(entry := build / next(keys))
    (entry / "m.so").unlink()
    os.link(secret, entry / "m.so")  # a hard link to it
    fake_build(entry := build / next(keys))
    (entry / "m.so").unlink()
    os.mkfifo(entry / "m.so")  # a FIFO: opening it for reading would block forever
    fake_build(entry := build / next(keys))
    (entry / buildcache.META_FILE).write_text(json.dumps(
        {"module": "m", "so": "../../secret", "is_python_module": True}))  # path in the meta
    fake_build(entry := build / next(keys))
    (entry / buildcache.META_FILE).unlink()
    os.symlink(secret, entry / buildcache.META_FILE)  # the metadata is a link
    fake_build(build / "not-a-key")
    assert buildstore.install(build, store, "a" * 64) == []
    assert not (store / ("a" * 64)).exists() or os.listdir(store / ("a" * 64)) == []

    # The build dir itself replaced by a link to someone else's builds.
    fake_build(tmp_path / "other" / next(keys))
    os.symlink(tmp_path / "other", tmp_path / "linked")
    assert buildstore.install(tmp_path / "linked", store, "a" * 64) == []

    # A plain build next to them installs, with its hash in the manifest.
    fake_build(good := tmp_path / "good" / next(keys))
    assert buildstore.install(tmp_path / "good", store, "a" * 64) == [good.name]
    manifest = json.loads((store / ("a" * 64) / good.name / buildstore.MANIFEST).read_text())
    assert manifest["files"] == {"m.so": hashlib.sha256(b"\x7fELF not really").hexdigest()}
    # First writer wins: a second install of the same key keeps the first.
    (good / "m.so").write_bytes(b"other")
    assert buildstore.install(tmp_path / "good", store, "a" * 64) == []


def test_staged_builds_are_read_only_for_candidate_processes(tmp_path, store):
    fake_build(tmp_path / "build" / ("b" * 64))
    buildstore.install(tmp_path / "build", store, "c" * 64)
    dest = tmp_path / "ext"
    assert buildstore.stage(store, "c" * 64, dest, None) == ["b" * 64]
    for path in [dest, *dest.rglob("*")]:
        st = os.lstat(path)
        assert stat.S_IMODE(st.st_mode) & 0o222 == 0, path
        if os.geteuid() == 0:
            assert st.st_uid == isolation.VAULT_UID  # not the uid of a capless-root child
    # Staging again (after the compile child) keeps what is there and adds nothing odd.
    assert buildstore.stage(store, "c" * 64, dest, None) == ["b" * 64]
    assert buildstore.stage(store, "d" * 64, tmp_path / "ext2", None) == []


def test_staging_never_follows_a_link_put_in_place_of_its_directory(tmp_path, store):
    """Where children share the harness's uid they can rename what lies in the evaluation's
    dir: a link to another directory in place of the staged one must not make the harness chmod
    or chown that directory (or fill it)."""
    fake_build(tmp_path / "build" / ("b" * 64))
    buildstore.install(tmp_path / "build", store, "c" * 64)
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o700)
    (victim / "keep").write_text("mine")
    before = os.lstat(victim)
    for dest, kind in ((tmp_path / "ext", "builds"), (tmp_path / "checks", "checks")):
        os.symlink(victim, dest)
        if kind == "builds":
            assert buildstore.stage(store, "c" * 64, dest, None) == ["b" * 64]
        else:
            buildstore.stage_checks(store, "c" * 64, dest, None)
        assert not dest.is_symlink() and dest.is_dir()
    after = os.lstat(victim)
    assert (after.st_mode, after.st_uid) == (before.st_mode, before.st_uid)
    assert os.listdir(victim) == ["keep"]


@pytest.mark.skipif(os.geteuid() != 0, reason="the vault needs a root harness")
def test_store_and_baselines_sit_in_the_vault(tmp_path):
    from kloop.evaluator.common.config import EvalConfig
    from kloop.evaluator.harness.stages import reference_serving
    from kloop.evaluator.harness.state import EvalRun
    from kloop.problems.registry import get_problem

    cache = tmp_path / "cache"
    run = EvalRun.create(get_problem("L3/1"), "x = 1\n", EvalConfig(device="cpu", cache_dir=cache))
    try:
        vault = isolation.private_dir(cache)
        assert reference_serving(run).cache_dir.parent == vault
        assert buildstore.store_root(cache).parent == vault
        st = os.lstat(vault)
        assert (st.st_uid, stat.S_IMODE(st.st_mode)) == (isolation.VAULT_UID, 0o700)
        # A confined child (root without capabilities here) cannot look inside.
        probe = subprocess.run(
            [sys.executable, "-c", "import os, sys\nfrom kloop.evaluator.worker.confine import confine_child\n"
             "confine_child()\ntry:\n    os.listdir(sys.argv[1])\nexcept "
             "PermissionError:\n    print('denied')\n", str(vault)],
            cwd=REPO, capture_output=True, text=True, timeout=120,
            env={**os.environ, "PYTHONPATH": str(REPO), linux.CONFINE_ENV: "caps"})
        assert probe.stdout.strip() == "denied", probe.stderr[-2000:]
    finally:
        run.cleanup()


E2E = f'''"""L3/1 with a host-side helper built by load_inline (no CUDA sources on this machine)."""
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

NO_CUDA = []
ext = load_inline(name="kloop_e2e_twice", cpp_sources={EXT!r}, cuda_sources=NO_CUDA,
                  no_implicit_headers=True)


class ModelNew(nn.Module):
    def __init__(self, input_size, layer_sizes, output_size):
        super().__init__()
        layers, current = [], input_size
        for hidden in layer_sizes:
            layers += [nn.Linear(current, hidden), nn.ReLU()]
            current = hidden
        layers.append(nn.Linear(current, output_size))
        self.network = nn.Sequential(*layers)

    def forward(self, x):
        return self.network(x) * (ext.twice(1) // 2)
'''


@pytest.mark.slow
def test_the_compile_stage_installs_and_the_next_evaluation_hits(tmp_path):
    from eval_helpers import cpu_config

    from kloop.evaluator.harness.pipeline import evaluate

    config = cpu_config(tmp_path / "cache")
    first = evaluate("L3/1", E2E, config)
    assert (first.status, first.backend) == ("not_run", "cuda"), first.error
    assert first.compile is not None and first.compile.ok and not first.compile.cache_hit
    entry_root = buildstore.store_root(tmp_path / "cache") / sha(E2E)
    [key] = os.listdir(entry_root)
    manifest = buildstore.BuildManifest.model_validate_json(
        (entry_root / key / buildstore.MANIFEST).read_text())
    so = (entry_root / key / manifest.so).read_bytes()
    assert manifest.files == {manifest.so: hashlib.sha256(so).hexdigest()}

    second = evaluate("L3/1", E2E, config)
    assert second.status == "not_run" and second.compile is not None
    assert second.compile.ok and second.compile.cache_hit
    # Another file with the same call builds its own.
    other = evaluate("L3/1", E2E + "# another file\n", config)
    assert other.compile is not None and not other.compile.cache_hit


def strings(source: str) -> dict[str, str]:
    return {n.targets[0].id: n.value.value for n in ast.parse(source).body
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)}


def nvcc_poisoner(honest: str) -> str:
    """A CUDA candidate (its build is host-only here) whose import forges the nvcc check result
    of `honest`'s sources, under the genuine key, wherever it can write."""
    s = strings(honest)
    return E2E.replace('"""L3/1 with', '"""Poisons nvcc checks; L3/1 with', 1) + f'''
import os, shutil
from pathlib import Path
from kloop.evaluator.build import nvcc

FORGED = nvcc.RawCheck(returncodes=[1], output="cuda.cu(12): error: forged by another file",
                       seconds=1.0)
nvcc._run_parallel = lambda cmds, cwd, timeout_s: FORGED
private = Path(os.environ[nvcc.CHECK_CACHE_ENV])
nvcc.nvcc_check([{s["cuda_source"]!r}], [{s["cpp_source"]!r}], None,
                private.parent / "forge", arch="sm_90", functions=["relu_forward"],
                cache_dir=private)
for target in (Path(os.environ[nvcc.CHECK_VERIFIED_ENV]),
               Path(os.environ["KLOOP_CACHE_DIR"]) / "nvcc_check"):
    try:
        shutil.copytree(private, target, dirs_exist_ok=True)
    except OSError:
        pass
'''


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_a_forged_nvcc_check_never_speaks_for_another_file(tmp_path, monkeypatch):
    from eval_helpers import cpu_config, light_cuda_candidate

    from kloop.evaluator.build import nvcc
    from kloop.evaluator.harness.pipeline import evaluate

    honest = light_cuda_candidate()
    poisoner = nvcc_poisoner(honest)
    config = cpu_config(tmp_path / "cache")
    # kernelbench: static rules only flag, so the import that carries the attack runs (under
    # strict it would first have to dodge the rule against importing the evaluator).
    attack = evaluate("L3/1", poisoner, config.model_copy(update={"policy": "kernelbench"}))
    assert attack.status == "not_run", attack.error
    [forged] = os.listdir(buildstore.checks_root(tmp_path / "cache") / sha(poisoner))

    # Had it been shared, the forged entry would have been the honest file's check result.
    staged = tmp_path / "staged"
    buildstore.stage_checks(buildstore.checks_root(tmp_path / "cache"), sha(poisoner), staged,
                            None)
    monkeypatch.setenv(nvcc.CHECK_VERIFIED_ENV, str(staged))
    s = strings(honest)
    would_be = nvcc.nvcc_check(s["cuda_source"], s["cpp_source"], None, tmp_path / "w",
                               functions=["relu_forward"], cache_dir=tmp_path / "empty")
    assert would_be.cache_hit and not would_be.ok
    monkeypatch.delenv(nvcc.CHECK_VERIFIED_ENV)

    result = evaluate("L3/1", honest, config)
    assert (result.status, result.stage_reached) == ("not_run", "compile"), result.compile
    assert result.compile is not None and result.compile.ok and not result.compile.cache_hit
    assert forged in os.listdir(buildstore.checks_root(tmp_path / "cache") / sha(honest))
