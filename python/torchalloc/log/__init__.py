"""Reading what a run left behind: torchalloc's event log and PyTorch's snapshot, as traces.

- reader.py: the binary log (docs/LOG_FORMAT.md), checked and decoded
  (`read_log`, and `to_csv` / `to_jsonl` for other tools);
- chunks.py: a log of any size read in pieces, in bounded memory (a small
  log is one piece): how report, replay and export read every log;
  checks.py: the records no writer produces, dropped or refused;
- trace_events.py, trace_stream.py, trace_snapshot.py, trace.py: either
  source as one allocation trace for replay (trace.py picks the reader);
- ranks.py: which rank each of a job's logs is.

The names a user types are re-exported here (`torchalloc.log.read_log`);
this package imports numpy, so the runtime never imports it.
"""
from __future__ import annotations

from .reader import LogFormatError, read_log, to_csv, to_jsonl

__all__ = ["LogFormatError", "read_log", "to_csv", "to_jsonl"]
