"""What of the host a contained child sees (run by the template process's fork, before any
candidate code, in the child's own mount namespace; trusted).

A child that acts as root without capabilities still owns root's files, and one in a user
namespace acts as the harness's uid on the harness's own files: file modes keep neither out of
home directories, shared scratch or /etc's secrets. What such a child reads can end up in its
exception text, and from there in the model's feedback. So every private directory becomes a
read-only tmpfs that holds only the way to the paths the child needs, each bound back from the
original (the names of everything else are gone too), and every entry under /etc that others
may not read is covered: /dev/null over a file, an empty tmpfs of mode 000 over a directory.
"""

from __future__ import annotations

import ctypes
import os
import stat
import sys

PRIVATE_ROOTS = ("/root", "/home", "/tmp", "/var/tmp", "/var/log", "/var/mail", "/var/spool",
                 "/run/user", "/run/secrets", "/srv", "/mnt", "/media")
"""Covered for every contained child, with the harness's home directory: the places where
users, services and other evaluations keep their files."""
SYSTEM_DIRS = frozenset({"/", "/usr", "/lib", "/lib64", "/bin", "/sbin", "/etc", "/opt", "/var",
                         "/proc", "/sys", "/dev", "/run", "/boot", "/nix"})
"""Never covered whole, whatever the harness's home directory is."""
SECRETS_UNDER = "/etc"
"""Entries here that others may not read are covered (/etc/shadow, sudoers, ssh host keys)."""

_MS_RDONLY, _MS_NOSUID, _MS_NODEV = 0x1, 0x2, 0x4
_MS_REMOUNT, _MS_BIND, _MS_REC = 0x20, 0x1000, 0x4000


def private_roots(home: str) -> list[str]:
    """`PRIVATE_ROOTS` and the harness's home directory (`home`) where it is one of a user's."""
    home = os.path.normpath(home) if home and os.path.isabs(home) else ""
    return [*PRIVATE_ROOTS, *([home] if home and home not in SYSTEM_DIRS else [])]


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def _outermost(paths: list[str]) -> list[str]:
    """The paths none of whose ancestors is among them, normalised and deduplicated."""
    norm = sorted({os.path.normpath(p) for p in paths}, key=len)
    out: list[str] = []
    for p in norm:
        if not any(_under(p, q) for q in out):
            out.append(p)
    return out


def _say(text: str) -> None:
    print(f"kloop: {text}: errno {ctypes.get_errno()}", file=sys.stderr)


def show_only_needed(libc: ctypes.CDLL, roots: list[str], needed: list[str]) -> None:
    """Cover each of `roots` (see module doc) but the way to `needed`; then /etc's secrets."""
    wanted = [os.path.normpath(p) for p in needed if os.path.isabs(p)]
    for root in _outermost(roots):
        if not os.path.isdir(root) or os.path.islink(root) or \
                any(_under(root, p) for p in wanted):  # needed whole: nothing to cover
            continue
        _show_only(libc, root, _outermost([p for p in wanted if _under(p, root)]))
    cover_unreadable(libc, SECRETS_UNDER)


def _show_only(libc: ctypes.CDLL, root: str, keep: list[str]) -> None:
    # Opened before the tmpfs covers them: bound back from the descriptor, the original shows.
    held = []
    for path in keep:
        try:
            held.append((path, os.open(path, os.O_PATH | os.O_CLOEXEC)))
        except OSError:
            continue
    try:
        if libc.mount(b"tmpfs", root.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV,
                      b"mode=0755,size=64k") != 0:
            _say(f"{root} not covered")
            return
        for path, fd in held:
            _bind_back(libc, path, fd)
        if libc.mount(None, root.encode(), None, _MS_REMOUNT | _MS_RDONLY | _MS_NOSUID |
                      _MS_NODEV, None) != 0:
            _say(f"{root} left writable")
    finally:
        for _path, fd in held:
            os.close(fd)


def _bind_back(libc: ctypes.CDLL, path: str, fd: int) -> None:
    try:
        is_dir = stat.S_ISDIR(os.fstat(fd).st_mode)
        os.makedirs(os.path.dirname(path), mode=0o755, exist_ok=True)
        if is_dir:
            os.makedirs(path, mode=0o755, exist_ok=True)
        else:
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
    except OSError as e:
        print(f"kloop: {path} not bound back: {e}", file=sys.stderr)
        return
    if libc.mount(f"/proc/self/fd/{fd}".encode(), path.encode(), None, _MS_BIND | _MS_REC,
                  None) != 0:
        _say(f"{path} not bound back")


def cover_unreadable(libc: ctypes.CDLL, top: str) -> None:
    """Cover every entry under `top` that others may not read (not following links)."""
    todo = [top]
    while todo:
        try:
            entries = list(os.scandir(todo.pop()))
        except OSError:
            continue
        for e in entries:
            try:
                mode = e.stat(follow_symlinks=False).st_mode
            except OSError:
                continue
            if stat.S_ISLNK(mode):
                continue
            if mode & stat.S_IROTH:
                if stat.S_ISDIR(mode):
                    todo.append(e.path)
                continue
            if stat.S_ISDIR(mode):
                done = libc.mount(b"tmpfs", e.path.encode(), b"tmpfs",
                                  _MS_RDONLY | _MS_NOSUID | _MS_NODEV, b"mode=000,size=4k")
            else:
                done = libc.mount(b"/dev/null", e.path.encode(), None, _MS_BIND, None)
            if done != 0:
                _say(f"{e.path} not covered")
