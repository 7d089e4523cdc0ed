"""Prompt rendering: jinja2 templates in `prompts/`, one render function, StrictUndefined.

Templates are data: `--prompts-dir DIR` puts a folder in front of the packaged one, so a user
copies and edits only the templates they want to change. Feedback templates are named
`feedback_<outcome>.j2` for each EvalResult status, plus `feedback_format_error.j2` for a reply
without a usable kernel.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import jinja2
from kloop.agent.ncu_hints import hint, stalls_text
from kloop.evaluator.common.resources import bare_name
from kloop.evaluator.common.result import SpeedupInterval
from kloop.evaluator.harness.precheck import source_with_constants

from kloop import prompts as prompts_package
from kloop.errors import KloopError

PACKAGED_DIR = Path(prompts_package.__file__).resolve().parent


def clip(text: str | None, limit: int = 3000) -> str:
    """Keep the head and the tail of long text (errors tend to be at either end)."""
    text = (text or "").rstrip()
    if len(text) <= limit:
        return text
    head = limit // 3
    tail = limit - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters cut ...]\n{text[-tail:]}"


def fmt_ms(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:.4g} ms" if value >= 0.01 else f"{value * 1000:.3g} us"


def fmt_x(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def fmt_ci(interval: SpeedupInterval | None) -> str:
    """The words that follow a speedup with an interval over the paired rounds (empty without
    one): `, 95 % interval 1.18-1.29 over 10 rounds`."""
    if interval is None:
        return ""
    return (f", {round(100 * interval.level, 1):g} % interval {interval.low:.2f}-{interval.high:.2f} "
            f"over {interval.rounds} rounds")


def fmt_num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def fmt_bytes(value: int | None) -> str:
    if value is None:
        return "-"
    return f"{value} B" if value < 1024 else f"{value / 1024:.1f} KB"


class PromptsDirError(KloopError, ValueError):
    """A `--prompts-dir` that is not a folder."""


def check_prompts_dir(folder: Path) -> None:
    """Refuse a `--prompts-dir` that is no folder, holds no template, or holds one jinja2
    cannot parse (found before any run dir exists, not at the first turn that renders it)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise PromptsDirError(f"{folder} is not a folder of .j2 templates (copies of those in "
                              f"{PACKAGED_DIR})")
    templates = sorted(folder.rglob("*.j2"))
    if not templates:
        raise PromptsDirError(f"{folder} holds no .j2 template: copy the ones to change from "
                              f"{PACKAGED_DIR}")
    env = jinja2.Environment()
    for path in templates:
        try:
            env.parse(path.read_text(encoding="utf-8"))
        except jinja2.TemplateSyntaxError as e:
            raise PromptsDirError(f"{path}:{e.lineno}: broken template: {e.message}") from None
        except UnicodeDecodeError:
            raise PromptsDirError(f"{path}: not UTF-8 text") from None


class PromptSet:
    """The templates of one run: a user folder (optional) in front of the packaged ones."""

    def __init__(self, prompts_dir: Path | None = None):
        dirs = [str(prompts_dir)] if prompts_dir is not None else []
        if prompts_dir is not None:
            check_prompts_dir(prompts_dir)
        self.env = jinja2.Environment(
            loader=jinja2.FileSystemLoader([*dirs, str(PACKAGED_DIR)]),
            undefined=jinja2.StrictUndefined,
            keep_trailing_newline=True,
            trim_blocks=True,
            lstrip_blocks=True,
            autoescape=False,
        )
        self.env.filters.update(clip=clip, ms=fmt_ms, x=fmt_x, ci=fmt_ci, num=fmt_num, nbytes=fmt_bytes,
                                bare_name=bare_name, stalls=stalls_text, ncu_hint=hint,
                                with_sizes=source_with_constants)

    def render(self, name: str, **variables: Any) -> str:
        """Render `name` (with or without `.j2`); a missing variable raises at once."""
        if not name.endswith(".j2"):
            name += ".j2"
        return self.env.get_template(name).render(**variables).strip() + "\n"

    def names(self) -> list[str]:
        return sorted(n for n in self.env.list_templates(extensions=["j2"]) if not n.startswith("_"))
