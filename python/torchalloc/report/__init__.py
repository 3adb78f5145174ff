"""Rendering an analysis (torchalloc.analysis) for people and tools.

- text.py: the text report and `report()`, the report as plain data;
- html.py, data.py, svg.py, page.js, page.css: the self-contained page;
- png.py: the timeline as a picture;
- job_text.py, job_html.py: a job's logs (one per rank) side by side;
- export.py: a log as PyTorch's memory snapshot (memory_viz).

The command lines are in torchalloc.cli.
"""
from __future__ import annotations

from .text import render_text, report

__all__ = ["render_text", "report"]
