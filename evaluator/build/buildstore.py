"""The harness's side of the `load_inline` build cache: a store candidate code cannot write.

Candidate code runs in the compile child (importing a candidate executes it), so nothing that
child writes may reach another evaluation unchecked. The child builds into a private directory of
its evaluation (`evaluator.build.buildcache`); once it has exited, the harness `install`s what it built:
it copies each entry's `.so` (regular files only, opened without following links) into the store
under the sha256 of the candidate file *it* hashed, writes the entry's metadata itself and a
manifest with the sha256 of every file, and renames the entry into place (the first writer wins).
Before a child of the same candidate file runs, `stage` copies that file's entries, each checked
against its manifest, into a read-only directory of the evaluation, which the children import
from. So a build can only ever be loaded by a byte-identical candidate file, whatever key or
payload another candidate computes.

The compile child's nvcc check results (`evaluator.build.nvcc`, CPU machines) are kept the same way:
its private check cache is installed under the candidate file's hash (plain files that parse as a
check, nothing else) and staged read-only for the next evaluation of that file. A forged check
result can therefore only ever speak for the file whose child wrote it.

The store lives in `private_dir` (the vault uid's, mode 0700 when the harness is root): neither
the sandbox uid nor root without capabilities can look inside. Staged copies belong to a uid the
candidate does not run under and are read-only. Limits: when the harness is not root, candidates
run under its uid and could rewrite the store; when they run as root without capabilities
(`isolation_same_uid`), they own the evaluation directories; a candidate running at the same
time as another evaluation could swap that evaluation's staged directory between staging and
loading, but only where children are not contained (a root harness contains them: each sees only
its own evaluation's directory, `zygote.ForkRequest.keep`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import stat
import uuid
from pathlib import Path

from kloop.evaluator.build.buildcache import META_FILE
from kloop.evaluator.procs.isolation import VAULT_UID, SandboxPlan, private_dir
from pydantic import BaseModel, ConfigDict, ValidationError

log = logging.getLogger(__name__)

MANIFEST = "manifest.json"
_KEY = re.compile(r"[0-9a-f]{64}")
_CHECK = re.compile(r"[0-9a-f]{64}\.json")
_MAX_CHECK_BYTES = 16 << 20
# What load_inline names its products: the module (the `name` argument) and `<name>.so`.
_MODULE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_MAX_ENTRIES = 16
_MAX_SO_BYTES = 512 << 20
_MAX_META_BYTES = 1 << 16
_CHUNK = 1 << 20


class BuildManifest(BaseModel):
    """What the harness installed for one `load_inline` call of one candidate file."""

    model_config = ConfigDict(extra="forbid")

    key: str
    candidate_sha256: str
    module: str
    so: str
    is_python_module: bool
    files: dict[str, str]
    """File name -> sha256 of its bytes, as the harness copied them."""


def store_root(cache_dir: Path) -> Path:
    return private_dir(cache_dir) / "extensions"


def checks_root(cache_dir: Path) -> Path:
    return private_dir(cache_dir) / "nvcc_check"


class Store:
    """One candidate file's view of the store, for the compile stage (see module doc)."""

    def __init__(self, cache_dir: Path, candidate_sha256: str, plan: SandboxPlan | None) -> None:
        self.builds, self.checks = store_root(cache_dir), checks_root(cache_dir)
        self.sha, self.plan = candidate_sha256, plan

    def stage(self, builds_dest: Path, checks_dest: Path) -> None:
        stage(self.builds, self.sha, builds_dest, self.plan)
        stage_checks(self.checks, self.sha, checks_dest, self.plan)

    def install(self, build_dir: Path, check_dir: Path) -> None:
        install(build_dir, self.builds, self.sha)
        install_checks(check_dir, self.checks, self.sha)


def _open_regular(dir_fd: int, name: str, limit: int) -> int:
    """An fd of `name` in `dir_fd` if it is a regular file of at most `limit` bytes with one
    link; never follows a symlink and never blocks on a FIFO."""
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC, dir_fd=dir_fd)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode) or st.st_nlink != 1 or st.st_size > limit:
        os.close(fd)
        raise ValueError(f"{name} is not a plain file of at most {limit} bytes")
    return fd


def _copy_fd(fd: int, dest: Path, limit: int) -> str:
    """Copy what `fd` holds into a new file `dest`; the sha256 of exactly the bytes written."""
    digest, total = hashlib.sha256(), 0
    with os.fdopen(fd, "rb") as src, open(dest, "xb") as out:
        while chunk := src.read(_CHUNK):
            total += len(chunk)
            if total > limit:
                raise ValueError(f"{dest.name} grew past {limit} bytes while copied")
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def _open_dir(name: str | Path, dir_fd: int | None = None) -> int:
    return os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                   dir_fd=dir_fd)


def _publish(tmp: Path, dest: Path) -> bool:
    try:
        os.rename(tmp, dest)
        return True
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)  # another evaluation installed it first
        return False


def _install_entry(top: int, key: str, dest: Path, candidate_sha256: str) -> bool:
    entry = _open_dir(key, top)
    try:
        meta_fd = _open_regular(entry, META_FILE, _MAX_META_BYTES)
        with os.fdopen(meta_fd, "rb") as f:
            meta = json.loads(f.read())
        module, so, is_module = meta["module"], meta["so"], meta["is_python_module"]
        if not (isinstance(module, str) and _MODULE.fullmatch(module) and so == f"{module}.so"
                and isinstance(is_module, bool)):
            raise ValueError(f"unexpected build metadata {meta!r:.200}")
        tmp = dest.parent / f".tmp-{key[:16]}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir(parents=True)
        try:
            digest = _copy_fd(_open_regular(entry, so, _MAX_SO_BYTES), tmp / so, _MAX_SO_BYTES)
            manifest = BuildManifest(key=key, candidate_sha256=candidate_sha256, module=module,
                                     so=so, is_python_module=is_module, files={so: digest})
            _write_meta(tmp, manifest)
            (tmp / MANIFEST).write_text(manifest.model_dump_json())
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    finally:
        os.close(entry)
    return _publish(tmp, dest)


def _write_meta(entry: Path, manifest: BuildManifest) -> None:
    (entry / META_FILE).write_text(json.dumps({
        "module": manifest.module, "so": manifest.so,
        "is_python_module": manifest.is_python_module}))


def install(build_dir: Path, store: Path, candidate_sha256: str) -> list[str]:
    """Install the complete builds a child left in `build_dir` (candidate-written: trusted for
    nothing) into `store` under `candidate_sha256`, the hash of the file the harness gave that
    child. Returns the keys installed; entries already in the store are kept."""
    try:
        top = _open_dir(build_dir)
    except OSError:
        return []
    installed: list[str] = []
    try:
        keys = sorted(n for n in os.listdir(top) if _KEY.fullmatch(n))
        for key in keys[:_MAX_ENTRIES]:
            dest = store / candidate_sha256 / key
            if (dest / MANIFEST).is_file():
                continue
            try:
                if _install_entry(top, key, dest, candidate_sha256):
                    installed.append(key)
            except (OSError, ValueError, KeyError, TypeError) as e:
                log.warning("build %s of candidate %s not installed: %s", key[:12],
                            candidate_sha256[:12], e)
    finally:
        os.close(top)
    return installed


def _stage_entry(entry: Path, dest: Path) -> None:
    manifest = BuildManifest.model_validate_json((entry / MANIFEST).read_text())
    if manifest.key != entry.name or manifest.candidate_sha256 != entry.parent.name:
        raise ValueError("manifest does not describe this entry")
    tmp = dest.parent / f".tmp-{entry.name[:16]}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    entry_fd = _open_dir(entry)
    try:
        for name, digest in manifest.files.items():
            fd = _open_regular(entry_fd, name, _MAX_SO_BYTES)
            got = _copy_fd(fd, tmp / name, _MAX_SO_BYTES)
            if got != digest:
                raise ValueError(f"{name} has sha256 {got[:12]}, its manifest says {digest[:12]}")
            (tmp / name).chmod(0o444)
        _write_meta(tmp, manifest)
        (tmp / META_FILE).chmod(0o444)
        tmp.chmod(0o555)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.close(entry_fd)
    _publish(tmp, dest)


def stage(store: Path, candidate_sha256: str, dest: Path, plan: SandboxPlan | None) -> list[str]:
    """Copy the store's builds of `candidate_sha256`, each verified against its manifest, into
    `dest`, read-only for candidate processes (see `readonly_owner`). An entry whose files do not
    match its manifest is removed from the store. Returns the keys staged."""
    _writable_dir(dest)
    staged: list[str] = []
    src = store / candidate_sha256
    entries = sorted(p for p in src.iterdir() if _KEY.fullmatch(p.name)) if src.is_dir() else []
    for entry in entries:
        if (dest / entry.name).exists():
            staged.append(entry.name)
            continue
        try:
            _stage_entry(entry, dest / entry.name)
            staged.append(entry.name)
        except (OSError, ValueError, ValidationError) as e:
            log.warning("cached build %s failed verification, removed: %s", entry, e)
            shutil.rmtree(entry, ignore_errors=True)
    _hand_over(dest, plan)
    return staged


def readonly_owner(plan: SandboxPlan | None) -> int | None:
    """Who owns staged builds: never the uid candidate code runs under. The harness's own uid
    when candidates run under the sandbox uid; the vault uid when they run as root without
    capabilities (root's files would be theirs to chmod); None when the harness is not root
    (it cannot give files away; candidates then share its uid)."""
    if os.geteuid() != 0:
        return None
    return 0 if plan is not None and plan.uid is not None else VAULT_UID


def _writable_dir(dest: Path) -> None:
    """`dest` as a real directory the harness can fill (read-only again after `_hand_over`).
    Whatever else stands there is removed, never followed: where candidates share the harness's
    uid, a child could have swapped the directory for a link to one the harness would then
    chmod and chown."""
    try:
        st = os.lstat(dest)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISDIR(st.st_mode):
        log.warning("%s was replaced by something other than a directory; removed", dest)
        dest.unlink()
        st = None
    if st is None:
        dest.mkdir()
    _set_dir(dest, 0o755, None)


def _set_dir(path: Path, mode: int, owner: int | None) -> None:
    """chmod (and chown) a directory through an fd opened without following a link."""
    fd = _open_dir(path)
    try:
        if owner is not None:
            os.fchown(fd, owner, owner)
        os.fchmod(fd, mode)
    finally:
        os.close(fd)


def _hand_over(dest: Path, plan: SandboxPlan | None) -> None:
    owner = readonly_owner(plan)
    for dirpath, dirnames, filenames in os.walk(dest):
        for name in [*dirnames, *filenames]:
            path = os.path.join(dirpath, name)
            if owner is not None:
                os.chown(path, owner, owner, follow_symlinks=False)
    _set_dir(dest, 0o555, owner)


def install_checks(check_dir: Path, store: Path, candidate_sha256: str) -> list[str]:
    """Install the nvcc check results a compile child left in `check_dir` (plain files named by
    their key that parse as a check) under `candidate_sha256`; the first result of a key stays."""
    from kloop.evaluator.build.nvcc import RawCheck

    try:
        top = _open_dir(check_dir)
    except OSError:
        return []
    installed: list[str] = []
    try:
        for name in sorted(n for n in os.listdir(top) if _CHECK.fullmatch(n))[:_MAX_ENTRIES]:
            dest = store / candidate_sha256 / name
            if dest.exists():
                continue
            try:
                with os.fdopen(_open_regular(top, name, _MAX_CHECK_BYTES), "rb") as f:
                    data = f.read(_MAX_CHECK_BYTES + 1)
                RawCheck.model_validate_json(data)
                dest.parent.mkdir(parents=True, exist_ok=True)
                tmp = dest.with_name(f".tmp-{uuid.uuid4().hex}")
                tmp.write_bytes(data)
                try:
                    os.link(tmp, dest)
                    installed.append(name)
                except FileExistsError:
                    pass
                finally:
                    tmp.unlink()
            except (OSError, ValueError) as e:
                log.warning("check %s of candidate %s not installed: %s", name[:12],
                            candidate_sha256[:12], e)
    finally:
        os.close(top)
    return installed


def stage_checks(store: Path, candidate_sha256: str, dest: Path,
                 plan: SandboxPlan | None) -> list[str]:
    """Copy the store's check results of `candidate_sha256` into `dest`, read-only."""
    _writable_dir(dest)
    src = store / candidate_sha256
    names = sorted(p.name for p in src.iterdir() if _CHECK.fullmatch(p.name)) \
        if src.is_dir() else []
    for name in names:
        if not (dest / name).exists():
            shutil.copyfile(src / name, dest / name, follow_symlinks=False)
            (dest / name).chmod(0o444)
    _hand_over(dest, plan)
    return names
