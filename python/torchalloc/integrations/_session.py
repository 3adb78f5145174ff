"""What the trainer callbacks share: install, the step's phases, markers, the report.

A trainer tells its callbacks where a training step is through hooks that
come one after another ("the batch starts", "backward is about to run",
...), not as pairs around each part. StepPhases turns that sequence into
properly nested torchalloc phases: entering a part ends the part before it.

Nothing here may stop training: a phase that cannot be ended (the user's
own phases left open across our hooks) or a report that cannot be written
is reported as a warning once, and the callback carries on without it.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Any

from .. import _lib, phases, plug

DEFAULT_LOG = "torchalloc_logs/run-%p.talog"


def _warn(message: str) -> None:
    warnings.warn(f"torchalloc: {message}", RuntimeWarning, stacklevel=3)


class StepPhases:
    """The phases one callback opened, innermost last.

    part(name): the step moves on to `name` (ends the current part first).
    end_part(): the step's current part is over.
    enter(name) / leave(name): a span around parts, like validation.
    close(): end everything still open (end of training, an exception).
    """

    def __init__(self, prefix: str = "") -> None:
        self.prefix = prefix
        self._open: list[tuple[str, bool]] = []  # (phase name, is a step part)
        self.enabled = True

    def _begin(self, name: str, is_part: bool) -> None:
        if not self.enabled:
            return
        try:
            phases.begin(self.prefix + name)
        except (RuntimeError, ValueError) as e:
            self._give_up(f"cannot begin phase {self.prefix + name!r} ({e})")
            return
        self._open.append((self.prefix + name, is_part))

    def _end_top(self) -> None:
        name, _ = self._open.pop()
        try:
            phases.end(name)
        except RuntimeError as e:
            self._give_up(f"cannot end phase {name!r}, so the trainer's phases stop here ({e}); "
                          "a phase of the program's own is probably still open across a trainer hook")

    def _give_up(self, why: str) -> None:
        if self.enabled:
            _warn(why)
        self.enabled = False
        self._open.clear()

    def current(self) -> str | None:
        return self._open[-1][0] if self._open else None

    def part(self, name: str) -> None:
        if self._open and self._open[-1] == (self.prefix + name, True):
            return
        self.end_part()
        self._begin(name, True)

    def end_part(self) -> None:
        if self._open and self._open[-1][1]:
            self._end_top()

    def enter(self, name: str) -> None:
        self.end_part()
        self._begin(name, False)

    def leave(self, name: str) -> None:
        """End span `name` and whatever opened inside it; nothing if it is not open."""
        target = (self.prefix + name, False)
        if target not in self._open:
            return
        while self.enabled and self._open and self._open[-1] != target:
            self._end_top()
        if self.enabled and self._open:
            self._end_top()

    def close(self) -> None:
        while self.enabled and self._open:
            self._end_top()


@dataclasses.dataclass
class ReportFiles:
    """What write_report() wrote."""

    log: str
    text: str
    html: str
    seconds: float
    summary: str


def write_report(log_path: str, *, out_stem: str | None = None, top: int = 15) -> ReportFiles:
    """Analyse the log written so far; write STEM.report.txt and STEM.report.html.

    The log may still be open: the reader stops at the last record written.
    """
    from ..report.text import render_text
    from ..report.html import write_html
    from ..analysis import analyze
    from ..units import fmt_bytes

    started = time.perf_counter()
    stem = out_stem if out_stem is not None else str(Path(log_path).with_suffix(""))
    # the file's size includes the writer's preallocation: an upper bound on what there is to read
    size = os.path.getsize(log_path)
    print(f"torchalloc: writing the report of {log_path}...", file=sys.stderr, flush=True)
    a = analyze(log_path, progress=size > (256 << 20), page=True)
    text_path, html_path = f"{stem}.report.txt", f"{stem}.report.html"
    Path(text_path).write_text(render_text(a, top=top))
    write_html(a, html_path)
    t = a.timeline
    summary = f"peak allocated {fmt_bytes(t.peak_allocated)}, peak reserved {fmt_bytes(t.peak_reserved)}"
    if t.ooms:
        summary += f", {len(t.ooms)} out-of-memory failure(s) (the report diagnoses them)"
    return ReportFiles(log_path, text_path, html_path, time.perf_counter() - started, summary)


class Session:
    """One training run seen by a callback: installation, step phases, report."""

    def __init__(
        self,
        who: str,
        *,
        policy: str | None,
        log: str | os.PathLike[str] | None,
        stacks: bool | None,
        report: bool,
        install: bool,
        conf: dict[str, Any],
    ) -> None:
        self.who = who
        self.report_enabled = report
        self.steps = StepPhases()
        self.report: ReportFiles | None = None
        self.active = False
        self.log_path: str | None = None
        if install:
            self._install(policy, log, stacks, conf)
        else:
            self._adopt()

    def _install(self, policy: str | None, log: str | os.PathLike[str] | None, stacks: bool | None,
                 conf: dict[str, Any]) -> None:
        import torch

        existing = plug.installed()
        if existing is not None and policy is None and log is None and stacks is None and not conf:
            self._adopt()  # torchalloc.install() ran already: use it as it is
            return
        if not torch.cuda.is_available():
            _warn(f"{self.who}: torch sees no CUDA GPU, so torchalloc is not installed and the callback does nothing")
            return
        log_path = os.fspath(log) if log is not None else DEFAULT_LOG
        Path(log_path).parent.mkdir(parents=True, exist_ok=True)
        try:
            plug.install(policy, log=log_path, stacks=stacks, **conf)
        except RuntimeError as e:
            raise RuntimeError(f"{self.who} could not install torchalloc: {e}\nCreate the callback before "
                               "anything uses CUDA (before the Trainer, TrainingArguments or any .cuda()).") from e
        self._adopt()

    def _adopt(self) -> None:
        if plug.installed() is None and not _lib.is_loaded():
            _warn(f"{self.who}: torchalloc is not set up (install=False and no torchalloc.install() ran); "
                  "the callback does nothing")
            return
        self.active = True
        self.log_path = _lib.lib().torchalloc_log_path()
        if isinstance(self.log_path, bytes):
            self.log_path = self.log_path.decode()

    # --- what the hooks call -------------------------------------------------

    def part(self, name: str) -> None:
        if self.active:
            self.steps.part(name)

    def end_part(self) -> None:
        if self.active:
            self.steps.end_part()

    def enter(self, name: str) -> None:
        if self.active:
            self.steps.enter(name)

    def leave(self, name: str) -> None:
        if self.active:
            self.steps.leave(name)

    def mark(self, label: str) -> None:
        if self.active:
            phases.mark(label)

    def finish(self, why: str = "training ended") -> ReportFiles | None:
        """Close every phase we opened, mark the end, write the report (if asked and a log exists).

        Each end of training (a second train() in one process) writes the report anew, of all the log holds.
        """
        if not self.active:
            return None
        self.steps.close()
        self.mark(why)
        if not self.report_enabled or self.log_path is None:
            return None
        try:
            self.report = write_report(self.log_path)
        except Exception as e:  # a report must never turn a finished run into a failed one
            _warn(f"{self.who}: could not write the report of {self.log_path}: {type(e).__name__}: {e}")
            return None
        r = self.report
        print(f"torchalloc: {r.summary}\n  report: {r.text}\n  page:   {r.html}\n  log:    {r.log} "
              f"(written in {r.seconds:.1f} s)", file=sys.stderr, flush=True)
        return r


class SessionCallback:
    """What both trainer callbacks share: their arguments become a Session, which they expose.

    A trainer's callback class lists this first (class TorchallocCallback(SessionCallback,
    TrainerCallback)), so its __init__ runs the trainer base's own through super().
    policy: "caching" (default), "exact" or "phase_arena".
    log: the event log's path ("%p" becomes the process id); default
      torchalloc_logs/run-%p.talog. stacks: record allocation stacks
      (Python source lines) in the log; slower, but the report can then
      say which line allocated what.
    report: write LOG_STEM.report.txt and .report.html when training ends
      (or fails with an exception).
    install: False when torchalloc is set up already (torchalloc.install()
      earlier in the program): the callback only marks phases and reports.
    conf: any other TORCHALLOC_CONF key (oom_report="off", log_max="4GiB", ...).
    """

    def __init__(
        self,
        policy: str | None = None,
        log: str | os.PathLike[str] | None = None,
        stacks: bool | None = None,
        *,
        report: bool = True,
        install: bool = True,
        **conf: Any,
    ) -> None:
        super().__init__()
        self.session = Session(type(self).__name__, policy=policy, log=log, stacks=stacks, report=report,
                               install=install, conf=conf)

    @property
    def log_path(self) -> str | None:
        return self.session.log_path

    @property
    def report(self) -> Any:
        """The report files written when training ended (a ReportFiles), or None."""
        return self.session.report
