"""The page's help, from the packaged page_help.md: the page links to nothing the package does not ship.

A small Markdown subset is enough for that one file, and the output is
checked by test_report_html.py: headings (#, ###), bullet lists (with
continuation lines), pipe tables, paragraphs, **bold** and `code`. Every
text is HTML-escaped before the inline marks are applied.
"""
from __future__ import annotations

import html
import re
from pathlib import Path

HELP_FILE = Path(__file__).resolve().parent / "page_help.md"


def _inline(text: str) -> str:
    out = html.escape(text, quote=False)
    out = re.sub(r"`([^`]+)`", r"<code>\1</code>", out)
    return re.sub(r"\*\*([^*]+)\*\*", r"<b>\1</b>", out)


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def help_html(text: str | None = None) -> str:
    """page_help.md (or `text`) as HTML, in a <section id="help">."""
    lines = (HELP_FILE.read_text(encoding="utf-8") if text is None else text).splitlines()
    out: list[str] = ['<section id="help">']
    para: list[str] = []
    items: list[str] = []
    table: list[list[str]] = []

    def flush() -> None:
        if para:
            out.append("<p>" + _inline(" ".join(para)) + "</p>")
            para.clear()
        if items:
            out.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in items) + "</ul>")
            items.clear()
        if table:
            head, rows = table[0], [r for r in table[1:] if not all(set(c) <= set("-: ") for c in r)]
            out.append('<table class="help"><tr>' + "".join(f"<th>{_inline(c)}</th>" for c in head) + "</tr>"
                       + "".join("<tr>" + "".join(f"<td>{_inline(c)}</td>" for c in r) + "</tr>" for r in rows)
                       + "</table>")
            table.clear()

    for line in lines:
        s = line.strip()
        if not s:
            flush()
        elif s.startswith("#"):
            flush()
            level = min(len(s) - len(s.lstrip("#")) + 1, 4)
            out.append(f"<h{level}>{_inline(s.lstrip('#').strip())}</h{level}>")
        elif s.startswith("|"):
            if para or items:
                flush()
            table.append(_cells(s))
        elif s.startswith("- "):
            if para or table:
                flush()
            items.append(s[2:])
        elif items and line.startswith("  "):
            items[-1] += " " + s
        else:
            para.append(s)
    flush()
    out.append("</section>")
    return "\n".join(out)
