"""A plan in words: the table `torchalloc plan` prints, fitted to the terminal (text_fit), and the one line
`torchalloc report` adds to its summary."""
from __future__ import annotations

import sys

from .. import text_fit
from ..replay.engine import INSTALL_DEFAULT, setting_of
from ..units import byte_unit, fmt_bytes
from .predict import MAX_MULTIPLE, PolicyPlan, best
from .result import NATIVE, Plan, fmt_multiple


def asked(plan: Plan) -> str:
    """'batch 96 (3x the recorded 32)' or '2x the recorded batch'."""
    x = fmt_multiple(plan.multiple)
    if plan.recorded is not None:
        return f"batch {plan.batch_of(plan.multiple)} ({x} the recorded {plan.recorded:g})"
    first = "the first log's" if len(plan.paths) > 1 else "the recorded"
    return f"{x} {first} batch"


def largest_words(plan: Plan, p: PolicyPlan) -> str:
    """'16.95x', 'batch 542 (16.94x)', 'at least 1024x', 'none'."""
    if p.largest is None:
        return "none" if p.fits is not None and p.searched else "-"
    x = ("at least " if p.at_least else "") + fmt_multiple(p.largest)
    batch = plan.batch_of(p.largest)
    return x if batch is None else f"batch {batch} ({x})"


def _fits(p: PolicyPlan) -> str:
    if p.fits is None:
        return "-"
    return "yes" if p.fits else ("no (too large)" if p.too_large else "no")


def best_words(plan: Plan) -> str:
    """The setting that fits the most, and the one of those keeping a cache when that is another."""
    b = plan.best
    cap = fmt_capacity(plan.capacity) if plan.capacity else ""
    if b is None:
        if not plan.searched:
            return ""  # --no-search (or no capacity): nothing to say about the largest
        return (f"No setting fits {cap} at any multiple of the batch: what does not grow with it alone is too "
                "large." if plan.capacity else "")
    def one(p: PolicyPlan) -> str:
        tag = ", the default" if p.is_default else (", PyTorch's allocator" if p.policy == NATIVE else "")
        return f"TORCHALLOC_CONF={setting_of(p.policy)} ({p.policy}{tag}): {largest_words(plan, p)}"

    text = f"The setting that fits the most in {cap}: {one(b)}"
    c = best(plan.policies, cached=True)
    if b.policy.startswith("exact") and c is not None:
        text += f", but with no cache every request asks the device; of those that keep a cache, {one(c)}"
    return text + "."


def render(plan: Plan, width: int | None = None) -> str:
    """The plan as `torchalloc plan` prints it, fitted to `width` columns (None: one line per sentence)."""
    cap = fmt_capacity(plan.capacity) if plan.capacity else ""
    above = [f"torchalloc plan: {', '.join(plan.paths)} -- device {plan.device}, at {asked(plan)}",
             f"model: {plan.model_fact}",
             f"capacity: {cap} ({plan.capacity_from})" if plan.capacity else "capacity: none given"]
    header = ["policy", "peak alloc", "peak reserved", f"fits {cap}" if cap else "fits", "largest that fits"]
    rows = [[f"{plan.recorded_by}, at 1x", fmt_bytes(plan.recorded_allocated, 2),
             fmt_bytes(plan.recorded_reserved, 2), "-", "-"]]
    for p in plan.policies:
        name = p.policy + (" *" if p.is_default else "")
        peaks = ("-", "-") if p.too_large else (fmt_bytes(p.peak_allocated, 2), fmt_bytes(p.peak_reserved, 2))
        rows.append([name, *peaks, _fits(p), largest_words(plan, p)])
    below = [f"* {INSTALL_DEFAULT}: what torchalloc.install() picks with no arguments; {NATIVE}: PyTorch's caching "
             "allocator, byte for byte (ordinary segments). Each row replays the run at "
             f"{fmt_multiple(plan.multiple)} on the simulated device; fits: it runs within the capacity (releasing "
             "its cache and retrying if it must, as on a GPU); largest that fits: "
             + (("bisection over " + ("whole batches" if plan.recorded else f"{plan.step:g}x steps")
                 + f" up to {MAX_MULTIPLE:g}x.") if plan.searched else "not searched.")]
    said = best_words(plan)
    if said:
        below.append(said)
    if plan.laws:
        shown = plan.laws[:8]
        more = f"; {len(plan.laws) - len(shown)} more in --json" if len(plan.laws) > len(shown) else ""
        below.append("Laws, the largest sites first: " + "; ".join(
            f"{site}: {law} ({n} allocation{'s' if n != 1 else ''}, {fmt_bytes(b)})" for site, law, n, b in shown)
            + more + ".")
    below.append("Limits:")
    limits = [f"- {x.text}" for x in plan.limits if x.text]
    if width is None:
        return "\n".join([*above, "", *text_fit.table(header, rows, sys.maxsize), "", *below, *limits]) + "\n"
    out = [line for text in above for line in text_fit.paragraph(text, width, more="    ")]
    out += ["", *text_fit.table(header, rows, width), ""]
    out += [line for text in below for line in text_fit.paragraph(text, width)]
    out += [line for text in limits for line in text_fit.paragraph(text, width, more="  ")]
    return "\n".join(out) + "\n"


def summary_line(plan: Plan, assumed: bool) -> str:
    """The report's line: 'Batch 2x: 61.2 GiB allocated, 62.0 GiB reserved under the default, fits in 80 GiB; the
    largest that fits about 3.1x (torchalloc plan)'. `assumed`: the capacity is not the log's, said so."""
    d = plan.default
    if d is None:
        return ""
    x = fmt_multiple(plan.multiple)
    if d.too_large:
        return f"Batch {x}: an allocation past any device (torchalloc plan)"
    text = f"Batch {x}: {fmt_bytes(d.peak_allocated)} allocated, {fmt_bytes(d.peak_reserved)} reserved under the " \
           "default"
    if plan.capacity:
        text += f", {'fits' if d.fits else 'does not fit'} in {fmt_capacity(plan.capacity)}"
        text += " (assumed)" if assumed else ""
        if d.at_least and d.largest is not None:
            text += f"; it still fits at {fmt_multiple(d.largest)}, where the search ends"
        elif d.largest is not None:
            text += f"; the largest that fits about {fmt_multiple(d.largest)}"
        else:
            text += "; no multiple fits"
    return text + " (torchalloc plan)"


def fmt_capacity(n: int) -> str:
    """A capacity as given: '80 GiB' for a whole number of its unit, else as fmt_bytes writes it."""
    unit, scale = byte_unit(n)
    return f"{n // scale} {unit}" if n % scale == 0 else fmt_bytes(n, 2)
