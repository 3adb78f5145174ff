"""`torchalloc export LOG... -o SNAPSHOT`: the command line of the export (report/export.py)."""
from __future__ import annotations

import argparse
import sys
from typing import Sequence

from ..log.ranks import assign_ranks
from ..log.reader import LogFormatError
from ..printable import printable
from ..log.chunks import ChunkedLog
from ..report.export import MAX_ENTRIES, to_snapshot, write_snapshot
from .args import bundled_demo, expand_logs, fail, output_problem, snapshot_pointer


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="torchalloc export",
        description="Convert a torchalloc log to a PyTorch memory snapshot pickle, for "
        "https://pytorch.org/memory_viz or torch.cuda._memory_viz (trace_plot, segment_plot, segsum).",
    )
    parser.add_argument("log", nargs="*", help="a torchalloc event log; several (one per rank), or a quoted "
                        "pattern such as 'run.*.talog', with %%r in -o; default: the bundled demo trace, "
                        "torchalloc/data/demo_trace.talog.xz, as report reports it")
    parser.add_argument("-o", "--output", required=True, help="the snapshot to write (.pickle, or .pickle.gz); with "
                        "several logs it must hold %%r, which becomes each log's rank (snap.%%r.pickle)")
    parser.add_argument("--max-entries", type=int, default=MAX_ENTRIES, metavar="N",
                        help="keep the last N trace entries of each device, as PyTorch's ring buffer "
                        "(_record_memory_history(max_entries=N)) does; 0 keeps them all (default: %(default)s). The "
                        "segments and blocks at the end are complete either way")
    args = parser.parse_args(argv)
    logs, problem = expand_logs(args.log or bundled_demo(parser.prog))
    problem = problem or next(filter(None, (snapshot_pointer(p, "export") for p in logs)), None)
    if not problem and len(logs) > 1 and "%r" not in args.output:
        problem = (f"-o {args.output}: {len(logs)} logs give {len(logs)} snapshots (memory_viz shows one process "
                   "at a time): put %r in the name, e.g. -o snap.%r.pickle")
    bad_output = output_problem(args.output.replace("%r", "0"))
    if args.max_entries < 0 and not problem:
        problem = f"--max-entries {args.max_entries}: give a number of entries, or 0 to keep them all"
    if problem or bad_output:
        fail(parser.prog, problem or f"-o {bad_output}")
    try:  # each log is read in pieces, twice, when its snapshot is built; here only its header
        headers = [ChunkedLog(p).header for p in logs]
    except LogFormatError as e:
        fail(parser.prog, str(e))
    ranks, rank_notes = assign_ranks([h.rank for h in headers])
    for note in rank_notes:
        print(printable(f"torchalloc export: note: {note}"), file=sys.stderr)
    for rank, path in zip(ranks, logs):
        output = args.output.replace("%r", str(rank))
        try:  # the notes: the log's own (damage, how it ended), then what was made up
            snapshot, notes, totals = to_snapshot(path, args.max_entries)
        except LogFormatError as e:
            fail(parser.prog, str(e))
        write_snapshot(snapshot, output)
        for note in notes:
            print(printable(f"torchalloc export: note: {note}"), file=sys.stderr)
        n, total = sum(len(t) for t in snapshot["device_traces"]), sum(totals)
        entries = (f"{n} trace entries" if n == total else
                   f"the last {n} of {total} trace entries (--max-entries {args.max_entries} per device, as "
                   "PyTorch's ring buffer keeps them; --max-entries 0 keeps all)")
        print(printable(f"wrote {output}: {entries}, {len(snapshot['segments'])} segments at the end"),
              file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
