"""Render a report document as GitHub-flavoured Markdown (images referenced by file name)."""

from __future__ import annotations

from kloop.agent.report.document import Bullets, Document, Heading, Image, Para, Table


def _cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("\n", " ")


def table(t: Table) -> str:
    lines = ["| " + " | ".join(_cell(h) for h in t.header) + " |",
             "|" + "|".join("---" for _ in t.header) + "|"]
    lines += ["| " + " | ".join(_cell(c) for c in row) + " |" for row in t.rows]
    return "\n".join(lines)


def render(doc: Document) -> str:
    parts = [f"# {doc.title}"]
    for block in doc.blocks:
        if isinstance(block, Heading):
            parts.append("#" * block.level + " " + block.text)
        elif isinstance(block, Para):
            parts.append(block.text)
        elif isinstance(block, Bullets):
            parts.append("\n".join(f"- {item}" for item in block.items))
        elif isinstance(block, Table):
            parts.append(table(block))
        elif isinstance(block, Image):
            parts.append(f"![{block.alt}]({block.file})")
        else:
            raise TypeError(f"unknown block {type(block).__name__}")
    return "\n\n".join(parts) + "\n"
