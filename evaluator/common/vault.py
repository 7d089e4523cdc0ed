"""The harness-private directory and how candidate children run: records and file-system
steps that the harness and its trusted build store (`evaluator.build`) share. No side."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from kloop.evaluator.common.linux import libc

VAULT_UID = 65533
"""Owner of the harness-private cache dir; any uid that runs nothing will do."""


@dataclass(frozen=True)
class SandboxPlan:
    """How candidate children run: under `uid`/`gid` (None: the harness's own), and whether they
    drop every capability (root without a usable unprivileged uid)."""

    uid: int | None
    gid: int | None
    drop_caps: bool
    reason: str

    @property
    def same_uid(self) -> bool:
        return self.uid is None


def private_dir(cache_dir: Path) -> Path:
    """`cache_dir/private`, for what only the harness and the reference worker write (baseline
    timings, the inductor cache of the torch.compile baseline). When the harness is root it
    belongs to an otherwise unused uid with mode 0700, so no candidate, under the sandbox uid or
    as root without capabilities, can look inside, let alone rewrite a baseline; root with
    capabilities (harness, reference worker) passes anyway."""
    return vault(cache_dir / "private")


def vault(path: Path) -> Path:
    """`path`, made if missing; when the harness is root, the vault uid's with mode 0700, so
    neither a sandbox uid nor root without capabilities gets in."""
    path.mkdir(parents=True, exist_ok=True)
    if libc() is not None and os.geteuid() == 0:
        st = os.lstat(path)
        if (st.st_uid, stat.S_IMODE(st.st_mode)) != (VAULT_UID, 0o700):
            os.chown(path, VAULT_UID, VAULT_UID, follow_symlinks=False)
            path.chmod(0o700)
    return path
