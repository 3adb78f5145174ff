"""The report's notes: the log's own (its damage, how its writer ended), then the analysis'.

Takes the `ChunkedLog` after a full pass and the first pass' `Scan`; gives
the notes in the order the report lists them: what reading the log found
(`table_notes`), then what the analysis found (`derive_notes`: the
devices, blocks from before the log, lost frees, no stacks, no backward)
and what the report lists only in part (markers, OOMs and phase
occurrences past those it keeps).
"""
from __future__ import annotations

from ..log.chunks import ChunkedLog
from ..log.reader import WRITER_KILLED, WRITER_RUNNING, WRITER_UNKNOWN
from .passes.first import MARKERS_KEPT, OOMS_KEPT, Scan
from .rules.roles import phase_role
from .timeline import SPANS_KEPT


def table_notes(log: ChunkedLog) -> list[str]:
    """The log's own notes (after a full pass): its damage, the records dropped, how its writer ended."""
    notes = list(log.damage) + [f"{log.path}: dropped {n}; a damaged or hand-made log" for n in log.dropped]
    header = log.header
    pid = header.pid
    if log.truncated:
        notes.append("the log was truncated (log_max reached or the disk filled): events after that are missing")
    elif log.writer == WRITER_RUNNING:
        notes.append(f"the log is still being written (process {pid} holds it): this covers it up to its last "
                     "complete record so far")
    elif log.writer == WRITER_KILLED:
        notes.append(f"the log was not closed and no process is writing it: its writer (process {pid}) was killed "
                     "or crashed mid-run; it ends at the last complete record")
    elif log.writer == WRITER_UNKNOWN and header.status == 0:
        notes.append("the log was not closed: its writer was killed or is still running (a copy cannot tell "
                     "which); it ends at the last complete record")
    return notes


def derive_notes(log: ChunkedLog, notes: list[str], s: Scan) -> list[str]:
    """The analysis' notes, after the log's own (`notes`)."""
    if len(s.devices) > 1:
        notes.append(f"the log has devices {s.devices}; this is device {s.device} (--device picks another)")
    before = len(s.orphans["addr"])
    if before:
        notes.append(f"{before} blocks were allocated before the log began (their frees are in it): "
                     "they count as live from its opening, so the peak includes them; it is a lower bound, "
                     "since blocks allocated and freed before the log are not in it")
    if s.lost_frees:
        notes.append(f"{s.lost_frees} addresses were allocated again while still live (a lost free record)")
    if len(s.orphans["addr"]) + s.blocks and not s.has_stacks:
        notes.append("no stacks in this log (TORCHALLOC_CONF stacks:1, or install(stacks=True)): reasons come from "
                     "phases only, and allocation sites are unknown")
    if backward_from(log.phase_names, s) == "none" and s.any_freed:
        notes.append("no backward pass found (no phase named backward, no Tensor.backward frames): "
                     "nothing can be called 'saved for backward'")
    if s.marker_count > MARKERS_KEPT:
        notes.append(f"the timeline lists the first {MARKERS_KEPT} of {s.marker_count} markers")
    if s.oom_count > OOMS_KEPT:
        notes.append(f"the report diagnoses the first {OOMS_KEPT} of {s.oom_count} OOM records")
    if len(s.occ_phase) > SPANS_KEPT:
        notes.append(f"the timeline lists the first {SPANS_KEPT} of {len(s.occ_phase)} phase occurrences")
    return notes


def backward_from(phase_names: dict[int, str], s: Scan) -> str:
    """How backward was found (rules/classify.py, rule 2): from phase names ("phase"), stacks ("stacks"), both
    ("phase+stacks"), or "none"."""
    by_phase = any(phase_role(name) == "backward" for name in phase_names.values())
    if s.stack_backward:
        return "phase+stacks" if by_phase else "stacks"
    return "phase" if by_phase else "none"
