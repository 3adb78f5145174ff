"""Replaying a recorded trace through torchalloc's policies on the simulated device (no GPU).

- engine.py: one trace through each policy and variant, the smallest
  device that fits, the table and JSON (`torchalloc replay`);
- ranks.py: a job's traces, one per rank, side by side;
- oom_alternatives.py: the events up to an out-of-memory, replayed under
  every alternative (the OOM analysis asks it which would have fit).

The command line is torchalloc.cli.replay.
"""
