"""`torchalloc report LOG LOG ...`: one report for a whole job, one log per rank, as text or JSON.

    torchalloc report run.0.talog run.1.talog      # ranks side by side, who peaked and why, shared and different
    torchalloc report 'run.*.talog'                # the same: a quoted pattern is expanded here
    torchalloc report run.*.talog --json           # as one JSON object: the job, then every rank's own report
    torchalloc report run.*.talog --html job.html  # one page with the ranks together (job_html.py)

The numbers come from torchalloc.analysis.job; `torchalloc report LOG` with one log
is the single-process report, unchanged.
"""
from __future__ import annotations

import json
import shutil
import sys
from typing import Sequence

from ..analysis.job import GroupRow, Job
from ..printable import printable
from ..units import fmt_bytes, fmt_time
from .text import MIN_WIDTH, WIDTH
from .text_table import text_table, wrap

__all__ = ["render_job_text", "write_job"]


def _group_rows(job: Job, groups: Sequence[GroupRow], top: int, width: int) -> list[str]:
    headers = ["allocated at", "block", "category"] + [f"rank {r.rank}" for r in job.ranks]
    rows = [[g.site, fmt_bytes(g.block_size), g.category] + [f"{c} = {fmt_bytes(n)}" if c else "-"
                                                              for c, n in zip(g.counts, g.bytes)]
            for g in groups[:top]]
    out = ["  " + line for line in text_table(headers, rows, right=range(3, 3 + len(job.ranks)), width=width - 2)]
    if len(groups) > top:
        out.append(f"  ... {len(groups) - top} more groups")
    return out


def render_job_text(job: Job, *, top: int = 15, width: int | None = None) -> str:
    """The job's report: ranks side by side, the highest and why, what is shared, what differs; in lines of at most
    `width` columns (default: $COLUMNS, the terminal's, or 100; at least MIN_WIDTH), as the one log's report."""
    if width is None:
        width = shutil.get_terminal_size((WIDTH, 24)).columns
    width = max(width, MIN_WIDTH)
    ranks = job.ranks
    world = f", world size {job.world_size}" if job.world_size else ""
    out = [f"torchalloc report: {len(ranks)} logs, ranks {', '.join(str(r.rank) for r in ranks)}{world}"]
    out += [f"note: {n}" for n in job.notes]
    for r, d in zip(ranks, job.details):
        out += [f"note: rank {r.rank}: {n}" for n in d.notes]
    out.append("")
    out.append("== Ranks side by side (each at its own peak of allocated bytes)")
    rows = [(r.rank, r.device, r.pid, fmt_bytes(r.peak_allocated), fmt_time(r.peak_t_s), fmt_bytes(r.peak_reserved),
             r.phase_at_peak, r.top_sites[0][0] if r.top_sites else "-") for r in ranks]
    out += text_table(["rank", "device", "pid", "peak allocated", "at", "peak reserved", "phase at peak", "largest site"],
                      rows, right=(0, 1, 2, 3, 4, 5), width=width)
    out += [f"rank {r.rank}: {r.path}" for r in ranks]  # below the table: a path is kept whole, on its own line
    out.append("")
    out.append(job.why_highest())
    out.append(job.oom_sentence())
    categories = list(dict.fromkeys(c for r in ranks for c in r.by_category))
    if categories:
        out.append("")
        out.append("== Live at each rank's peak, by category")
        crow = [[c] + [fmt_bytes(r.by_category.get(c, 0)) for r in ranks] for c in categories]
        out += text_table(["category"] + [f"rank {r.rank}" for r in ranks], crow, right=range(1, 1 + len(ranks)),
                          width=width)
    out.append("")
    out.append(f"== Shared: {fmt_bytes(job.shared_bytes)} per rank in blocks of the same site and size, as many in "
               "every rank (parameters, gradients, even optimizer-state shards)")
    out += _group_rows(job, job.shared, top, width) if job.shared else ["  nothing"]
    out.append("")
    out.append("== Where the ranks differ: blocks of one site and size in different numbers (uneven shards or "
               "batches, one rank's own work)")
    out += _group_rows(job, job.differ, top, width) if job.differ else ["  nowhere: every rank held the same blocks at its peak"]
    out.append("")
    out.append("One rank's full report (timeline, lifetimes, phases): torchalloc report LOG")
    fitted = []  # each line longer than the width wrapped, its next lines indented two more (tables already fit)
    for line in out:
        body = line.lstrip(" ")
        fitted += wrap(body, width, line[:len(line) - len(body)])
    return "\n".join(fitted) + "\n"


def write_job(job: Job, *, text: bool, json_out: bool, html: str | None, top: int) -> None:
    """What `torchalloc report` prints or writes for several logs."""
    if html:
        from .job_html import write_job_html

        write_job_html(job, html)
        print(printable(f"wrote {html}"), file=sys.stderr)
    if json_out:
        json.dump(job.to_dict(top=max(top, 50)), sys.stdout, indent=1)
        sys.stdout.write("\n")
    elif text:
        sys.stdout.write(printable(render_job_text(job, top=top), newlines=True))
