"""Render a report document as ONE self-contained HTML page: the PNGs embedded as base64, the
style inline, no scripts, fonts or links to anything outside the file (it renders offline)."""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

from kloop.agent.report.document import Bullets, Document, Heading, Image, Para, Table

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1200px; color: #222; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 0.85em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.55em; text-align: left; }
th { background: #f0f0f0; }
tr:nth-child(even) td { background: #fafafa; }
img { max-width: 100%; display: block; margin: 0.6em 0 1.4em; }
code { background: #f3f3f3; padding: 0 0.2em; }
"""


def _inline(text: str) -> str:
    """Escape, then turn Markdown `code` spans into <code> (the only inline markup we write)."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def _image(block: Image, image_dir: Path) -> str:
    data = base64.b64encode((image_dir / block.file).read_bytes()).decode("ascii")
    return f'<img alt="{html.escape(block.alt)}" src="data:image/png;base64,{data}">'


def _table(t: Table) -> str:
    head = "".join(f"<th>{_inline(h)}</th>" for h in t.header)
    body = "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in row) + "</tr>" for row in t.rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def render(doc: Document, image_dir: Path) -> str:
    parts = []
    for block in doc.blocks:
        if isinstance(block, Heading):
            parts.append(f"<h{block.level}>{_inline(block.text)}</h{block.level}>")
        elif isinstance(block, Para):
            parts.append(f"<p>{_inline(block.text)}</p>")
        elif isinstance(block, Bullets):
            parts.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in block.items) + "</ul>")
        elif isinstance(block, Table):
            parts.append(_table(block))
        elif isinstance(block, Image):
            parts.append(_image(block, image_dir))
        else:
            raise TypeError(f"unknown block {type(block).__name__}")
    title = html.escape(doc.title)
    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{title}</title>'
            f"<style>{_STYLE}</style></head><body><h1>{title}</h1>\n" + "\n".join(parts) + "\n</body></html>\n")
