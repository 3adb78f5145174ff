"""`torchalloc export LOG... -o SNAPSHOT`: the command line of the export (report/export.py)."""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from ..analysis import load
from ..log.ranks import assign_ranks
from ..log.reader import LogFormatError
from ..printable import printable
from ..report.export import to_snapshot, write_snapshot
from .args import expand_logs, fail, output_problem, snapshot_pointer


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="torchalloc export",
        description="Convert a torchalloc log to a PyTorch memory snapshot pickle, for "
        "https://pytorch.org/memory_viz or torch.cuda._memory_viz (trace_plot, segment_plot, segsum).",
    )
    parser.add_argument("log", nargs="+", help="a torchalloc event log; several (one per rank), or a quoted "
                        "pattern such as 'run.*.talog', with %%r in -o")
    parser.add_argument("-o", "--output", required=True, help="the snapshot to write (.pickle, or .pickle.gz); with "
                        "several logs it must hold %%r, which becomes each log's rank (snap.%%r.pickle)")
    args = parser.parse_args(argv)
    logs, problem = expand_logs(args.log)
    problem = problem or next(filter(None, (snapshot_pointer(p, "export") for p in logs)), None)
    if not problem and len(logs) > 1 and "%r" not in args.output:
        problem = (f"-o {args.output}: {len(logs)} logs give {len(logs)} snapshots (memory_viz shows one process "
                   "at a time): put %r in the name, e.g. -o snap.%r.pickle")
    bad_output = output_problem(args.output.replace("%r", "0"))
    if problem or bad_output:
        fail(parser.prog, problem or f"-o {bad_output}")
    try:
        tables = [load(p) for p in logs]
    except LogFormatError as e:
        fail(parser.prog, str(e))
    ranks, rank_notes = assign_ranks([t.rank for t in tables])
    for note in rank_notes:
        print(printable(f"torchalloc export: note: {note}"), file=sys.stderr)
    for rank, table in zip(ranks, tables):
        output = args.output.replace("%r", str(rank))
        snapshot, notes = to_snapshot(table)
        write_snapshot(snapshot, output)
        for note in list(table.notes) + notes:  # the log's own (damage, how it ended), then what was made up
            print(printable(f"torchalloc export: note: {note}"), file=sys.stderr)
        n = sum(len(t) for t in snapshot["device_traces"])
        print(printable(f"wrote {output}: {n} trace entries, {len(snapshot['segments'])} segments at the end"), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
