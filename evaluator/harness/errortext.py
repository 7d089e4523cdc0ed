"""Error text cut to what a model needs before it enters a result (harness side).

An `ErrorInfo` that reaches a result was, as often as not, written by the candidate's process
(its exception, its stderr): whatever that process could read, it could put there, and the
result goes into the model's feedback and so to the provider. So every error is cut here, in
the one place a verdict's error is recorded (`outcome.fold`): the exception's type, its message
and the frames of the candidate's own file, a few hundred characters each, and every absolute
path outside the evaluation's dir replaced by `<path>` (paths inside it are shown relative).

The other text a candidate's process or its compiler can shape is cut the same way in the fold
(`cut`): flags and violation messages (a probe's details), a trial's message (the worker's
account of a failed call), compiler diagnostics and the compile log's tail (a compiler quotes
what a candidate includes), and the names of profiled kernels (a kernel built at run time is
named by the candidate).
"""

from __future__ import annotations

import re
from pathlib import Path

from kloop.evaluator.common.result import ErrorInfo

TYPE_CHARS = 80
MESSAGE_CHARS = 400
TRACEBACK_CHARS = 800
STDERR_CHARS = 800
CANDIDATE_FILE = "candidate.py"

# An absolute path: a slash not preceded by a word character, a dot or another slash, then
# name characters (so `4/8` and `x.y/z` are not paths).
_PATH = re.compile(r"(?<![\w./])(?:/[\w.@+~-]+)+/?")
_FRAME = re.compile(r'^  File "(?P<file>[^"]*)", line \d+')


def scrub(text: str, eval_root: Path) -> str:
    """`text` with paths in `eval_root` made relative to it and every other absolute path
    replaced by `<path>`."""
    root = str(eval_root).rstrip("/") + "/"

    def one(m: re.Match[str]) -> str:
        path = m.group(0)
        return path[len(root):] if path.startswith(root) else "<path>"

    return _PATH.sub(one, text)


FLAG_CHARS = 400
NAME_CHARS = 200


def cut(text: str, eval_root: Path, limit: int = MESSAGE_CHARS, tail: bool = False) -> str:
    """`text` scrubbed of host paths (`scrub`) and cut to `limit` characters: its start, or its
    end with `tail`."""
    text = scrub(text, eval_root)
    return _tail(text, limit) if tail else _clip(text, limit)


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _tail(text: str, limit: int) -> str:
    return text if len(text) <= limit else "..." + text[-(limit - 3):]


def own_frames(traceback: str, eval_root: Path) -> str:
    """The frames of the candidate's own file (its `File` line and source line) and the
    closing exception line(s), from a traceback as `traceback.format_list` writes it."""
    lines = traceback.splitlines()
    kept: list[str] = []
    i, last_frame_end = 0, 0
    while i < len(lines):
        m = _FRAME.match(lines[i])
        if m is None:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and lines[end].startswith("    "):
            end += 1
        file = m.group("file")
        if file.endswith("/" + CANDIDATE_FILE) and file.startswith(str(eval_root)):
            kept += lines[i:end]
        last_frame_end = i = end
    kept += lines[last_frame_end:]
    return "\n".join(kept)


def for_model(info: ErrorInfo, eval_root: Path) -> ErrorInfo:
    """`info` cut to what a model needs (see module doc)."""
    tb = info.traceback
    if tb is not None:
        tb = _tail(scrub(own_frames(tb, eval_root), eval_root), TRACEBACK_CHARS)
    stderr = info.stderr_tail
    if stderr is not None:
        stderr = _tail(scrub(stderr, eval_root), STDERR_CHARS)
    return ErrorInfo(type=_clip(scrub(info.type, eval_root), TYPE_CHARS),
                     message=_clip(scrub(info.message, eval_root), MESSAGE_CHARS),
                     traceback=tb, stderr_tail=stderr)
