"""Reading what a run left behind: torchalloc's event log and PyTorch's snapshot, as traces.

- format.py: the binary log (docs/LOG_FORMAT.md) as data: its sizes,
  slot dtypes, header and checksum; files.py: its file opened, inflated,
  its writer asked;
- decode.py: the one decoder of a log's slots, piece by piece: event
  records, strings, frames, stacks, and a note for every damaged slot;
  checks.py: the records no writer produces, dropped or refused;
- the decoder's two drivers: reader.py (`read_log`, a whole log as one
  piece, and `to_csv` / `to_jsonl` for other tools) and chunks.py (a log
  of any size read in pieces, in bounded memory: how report, replay and
  export read every log);
- trace_events.py, trace_stream.py, trace_snapshot.py, trace.py: either
  source as one allocation trace for replay (trace.py picks the reader);
- ranks.py: which rank each of a job's logs is.

The names a user types are re-exported here (`torchalloc.log.read_log`);
this package imports numpy, so the runtime never imports it.
"""
from __future__ import annotations

from .reader import LogFormatError, read_log, to_csv, to_jsonl

__all__ = ["LogFormatError", "read_log", "to_csv", "to_jsonl"]
