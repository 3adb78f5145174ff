"""One frame of `torchalloc top`, as plain lines of text: what `--once` prints and the terminal view draws.

Takes `LiveState`s (top_state.py); gives lines no wider than asked. A log's
frame is a column; several logs (one per rank) stand side by side while each
column gets at least MIN_COLUMN characters, else one below the other.
Labels (sites, phases, modules) are cut to fit, figures never.
"""
from __future__ import annotations

import os
import textwrap
from typing import Sequence

from ..analysis.sections.leaks import MIN_STEPS, too_few
from ..printable import printable
from ..units import fmt_bytes
from .top_state import LiveState

MIN_COLUMN = 64  # narrower than this, ranks are stacked
GAP = "  |  "
REASON_W = 20  # "freed so far as", in the short words below
SHORT_REASONS = {"freed when its function returned": "function return", "freed on rebinding": "rebinding"}
VIEWS = ("sites", "phases", "modules")  # what the table of live bytes groups by; a key cycles through them
BARS = "▁▂▃▄▅▆▇█"
ASCII_BARS = "_.-=+*#@"  # for a terminal whose encoding has no block characters


def _t(state: LiveState, t_ns: int) -> str:
    return f"t={state.seconds(t_ns):.3f} s"


def _records(n: int, what: str) -> str:
    """"1 impossible record", "3 records failing their checksum"."""
    noun = "record" if n == 1 else "records"
    return f"{n} {what} {noun}" if what == "impossible" else f"{n} {noun} {what}"


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def _flow(cells: Sequence[str], width: int, gap: str = "   ") -> list[str]:
    """Cells joined by `gap`, a new line where the next would pass `width` (a cell alone may)."""
    lines: list[str] = []
    line = ""
    for cell in cells:
        if line and len(line) + len(gap) + len(cell) > width:
            lines.append(line)
            line = ""
        line = f"{line}{gap}{cell}" if line else cell
    return lines + [line] if line else lines


def sparkline(values: Sequence[int], width: int, bars: str = BARS) -> str:
    """A line of bars, one per value (the last `width`), 0 at the lowest bar and the highest value at the top."""
    shown = list(values)[-width:]
    if not shown:
        return ""
    top = max(shown) or 1
    return "".join(bars[min(int(v / top * (len(bars) - 1) + 0.5), len(bars) - 1)] for v in shown)


def _table(state: LiveState, view: str, rows: int, width: int) -> list[str]:
    if view == "sites":
        groups = state.by_site()
        phases = state.site_phases()
        reasons = state.site_reasons()
        last = state.markers[-1] if state.markers else None
    else:
        groups = state.by_phase() if view == "phases" else state.by_module()
    title = {"sites": "Live by site", "phases": "Live by the phase that allocated",
             "modules": "Live by module (its tag, else current at the allocation)"}[view]
    order = sorted(groups.items(), key=lambda kv: (-kv[1][0], kv[0]))
    figures = 11 + 8 + (22 + REASON_W if view == "sites" else 0)
    label_w = max(width - figures - 2, 12)
    since = ""
    if view == "sites":
        since = f"; grew since {printable(repr(last.label))}" if last else ""
    out = [_cut(f"{title} ({len(groups)}{since}):", width)]
    head = f"  {'':<{label_w}}{'live':>11}{'blocks':>8}"
    if view == "sites":
        head += f"  {'made in':<10}{'grew':>10}  {'freed so far as':<{REASON_W - 2}}"
    out.append(head.rstrip())
    for label, (size, count) in order[:rows]:
        line = f"  {_cut(printable(label), label_w):<{label_w}}{fmt_bytes(size):>11}{count:>8}"
        if view == "sites":
            grew = ""
            if last is not None:
                change = size - last.sites.get(label, 0)
                grew = f"+{fmt_bytes(change)}" if change > 0 else "-" + fmt_bytes(-change) if change < 0 else "0 B"
            line += f"  {_cut(printable(phases.get(label, '')), 10):<10}{grew:>10}"
            reason = reasons.get(label, "-")
            line += f"  {_cut(SHORT_REASONS.get(reason, reason), REASON_W - 2)}"
        out.append(line)
    if len(order) > rows:
        out.append(f"  ... {len(order) - rows} more")
    return out


def _grew_lines(state: LiveState, width: int) -> list[str]:
    """What grew between the last two markers, per site: a site that grows at every step shows here."""
    if len(state.markers) < 2:
        return []
    before, after = state.markers[-2], state.markers[-1]
    grew = sorted(((after.sites.get(s, 0) - before.sites.get(s, 0), s) for s in after.sites), reverse=True)
    grew = [(b, s) for b, s in grew if b > 0][:3]
    head = f"Grew from {printable(repr(before.label))} to {printable(repr(after.label))}:"
    if not grew:
        return [head + " nothing"]
    return [head] + [f"  +{fmt_bytes(b):>10}  {_cut(printable(s), width - 16)}" for b, s in grew]


def _leak_lines(state: LiveState, width: int) -> list[str]:
    """The leaks by the rule of analysis/sections/leaks.py, that none is, or that too few step markers have come yet."""
    if state.step_kind() is None:
        return []
    count = state.step_markers()
    if count < MIN_STEPS:
        still = " yet" if state.writer == "running" else ""
        return [_cut(f"Leaks: {too_few(count, printable(state.step_kind() or ''))}{still}", width)]
    leaks = state.leaks()
    head = "Leaks (a site whose low point over the step markers rose, never given back):"
    if not leaks:
        return [_cut(head[:-1] + ": none", width)]
    return [_cut(head, width)] + [_cut(f"  {printable(leak.words())}", width) for leak in leaks[:3]]


def _oom_lines(state: LiveState, width: int) -> list[str]:
    o = state.oom
    if o is None:
        return []
    cells = [f"Last OOM at {_t(state, o.t_ns)} in {printable(o.phase)}: asked {fmt_bytes(o.requested)}",
             f"reserved {fmt_bytes(o.reserved)}"]
    if o.allocated is not None:
        cells.append(f"allocated {fmt_bytes(o.allocated)}")
    cells.append(f"at {printable(o.site)}")
    lines = _flow(cells, width)
    if o.verdict == "fragmentation" and o.allocated is not None:
        verdict = (f"verdict: fragmentation: {fmt_bytes(o.reserved - o.allocated)} of the {fmt_bytes(o.reserved)} "
                   "reserved was free, but not in one range the request fit")
    elif o.verdict == "capacity" and o.allocated is not None:
        total = f"the device's {fmt_bytes(o.device_total)}" if o.device_total else "what the device could give"
        verdict = (f"verdict: capacity: live tensors ({fmt_bytes(o.allocated)}) and the {fmt_bytes(o.requested)} "
                   f"asked for exceed {total}")
    else:
        verdict = f"verdict: {o.verdict}"
    for text in [verdict] + ([f"advice: {o.advice}"] if o.advice else []):  # wrapped, never cut: they are read whole
        lines += textwrap.wrap(text, width, initial_indent="  ", subsequent_indent="    ", break_on_hyphens=False)
    lines.append("  " + _cut(f"the whole account: torchalloc report {state.reader.path}", width - 2))
    return lines


def log_frame(state: LiveState, width: int, view: str, rows: int, bars: str = BARS) -> list[str]:
    """The frame of one log, `width` characters wide at most."""
    h = state.reader.header
    rank = f"rank {h.rank}" if h.rank >= 0 else "no rank"
    lines = _flow([printable(os.path.basename(state.reader.path)), f"pid {h.pid}", rank,
                   f"writer {state.writer}", f"{state.records} records", f"at {_t(state, state.last_ns)}"], width)
    lines += _flow([f"allocated {fmt_bytes(state.allocated)} (peak {fmt_bytes(state.peak_allocated)} at "
                    f"{_t(state, state.peak_allocated_ns)})",
                    f"reserved {fmt_bytes(state.reserved)} (peak {fmt_bytes(state.peak_reserved)} at "
                    f"{_t(state, state.peak_reserved_ns)})"], width)
    columns = state.spark.columns()
    spark_w = max(width - 24, 8)
    shown = min(len(columns), spark_w) * state.spark.width / 1e9
    lines.append(f"allocated {sparkline(columns.tolist(), spark_w, bars)}  (last {shown:.1f} s)")
    last = state.markers[-1] if state.markers else None
    marker = f"marker {printable(repr(last.label))} at {_t(state, last.t_ns)}" if last else "no marker yet"
    lines += _flow([f"phase {printable(state.current_phase())}", marker], width)
    fragmentation, cache, mapped_free = state.reserve_split()
    lines += _flow([f"reserved {fmt_bytes(state.reserved)} = {fmt_bytes(state.allocated)} allocated",
                    f"+ {fmt_bytes(fragmentation)} fragmentation", f"+ {fmt_bytes(cache)} cache",
                    f"+ {fmt_bytes(mapped_free)} mapped free"], width, " ")
    if state.window_ns >= 10**9:
        per_s = 1e9 / state.window_ns
        rates = f"maps {state.maps * per_s:.1f}/s, unmaps {state.unmaps * per_s:.1f}/s"
        lines.append(f"{rates} (over the last {state.window_ns / 1e9:.1f} s of the log)")
    else:  # a rate over less than a second says little: the counts
        lines.append(f"maps {state.maps}, unmaps {state.unmaps} (in the last {state.window_ns / 1e9:.3f} s of the log)")
    reader = state.reader
    if reader.impossible or reader.dropped:  # what `report` drops, dropped here too, and said
        parts = ([_records(reader.impossible, "impossible")] if reader.impossible else []) + \
                ([_records(reader.dropped, "failing their checksum")] if reader.dropped else [])
        lines += _flow([f"dropped {' and '.join(parts)}:", "a damaged or hand-made log", "(`torchalloc report` "
                        "names them)"], width, " ")
    if reader.holes:  # the run goes on past them: say where the log is missing records
        named = ", ".join(f"{slot} (byte offset {reader.header.header_size + slot * 64})" for slot in reader.hole_slots)
        more = f" and {reader.holes - len(reader.hole_slots)} more" if reader.holes > len(reader.hole_slots) else ""
        lines += textwrap.wrap(f"passed over {reader.holes} slot{'s' if reader.holes > 1 else ''} the writer "
                               "never completed, though later ones are (damaged, or a thread killed mid-record): "
                               f"slot {named}{more}", width, break_on_hyphens=False)
    if reader.waiting_at is not None and state.writer == "running":
        lines += textwrap.wrap(f"stopped at slot {reader.waiting_at} (byte offset "
                               f"{reader.header.header_size + reader.waiting_at * 64}): not complete, though later "
                               "ones are; being written, or damaged (passed over if still so at the next refresh)",
                               width, break_on_hyphens=False)
    if state.before_log_frees:
        lines.append(_cut(f"({state.before_log_frees} frees of blocks allocated before the log began: allocated "
                          "counts the log's blocks only)", width))
    lines.append("")
    lines += _table(state, view, rows, width)
    grew = _grew_lines(state, width)
    oom = _oom_lines(state, width)
    for part in (grew, _leak_lines(state, width), oom):
        if part:
            lines += [""] + part
    return [_cut(line, width) for line in lines]


def frame(states: Sequence[LiveState], width: int, view: str = "sites", rows: int = 8, bars: str = BARS
          ) -> list[str]:
    """The frame of every log: side by side when each gets MIN_COLUMN characters, else stacked."""
    if len(states) > 1 and (width - len(GAP) * (len(states) - 1)) // len(states) >= MIN_COLUMN:
        col = (width - len(GAP) * (len(states) - 1)) // len(states)
        columns = [log_frame(s, col, view, rows, bars) for s in states]
        height = max(map(len, columns))
        return [GAP.join(f"{(c[i] if i < len(c) else ''):<{col}}" for c in columns).rstrip() for i in range(height)]
    lines: list[str] = []
    for k, s in enumerate(states):
        lines += ([""] if k else []) + log_frame(s, width, view, rows, bars)
    return lines
