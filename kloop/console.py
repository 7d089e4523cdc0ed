"""The consoles the CLI prints through: never wrapped at 80 columns when the output is piped."""

from __future__ import annotations

from rich.console import Console


def make_console(stderr: bool = False) -> Console:
    """A rich Console; piped (CI logs, `| less`, a file) it keeps long lines whole."""
    console = Console(stderr=stderr)
    if not console.is_terminal:
        console.width = 200
        console.soft_wrap = True
    return console
