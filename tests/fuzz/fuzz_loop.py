"""What the plain-Python mutation fuzzers (fuzz_log_decode.py, fuzz_snapshot.py) share: one input run under a
time bound, a failure saved and shown, and the tally they print at the end."""
from __future__ import annotations

import signal
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any


class InputTimeout(BaseException):
    """Raised by the timer when one input runs past its time bound. Not an Exception: code under test that
    turns every Exception into its own error (the snapshot unpickler's caller does) must not swallow it."""


def _on_alarm(signum: int, frame: Any) -> None:  # noqa: ARG001
    raise InputTimeout()


class Campaign:
    """One fuzzer's run: its name (the prefix of every line), seed, time bound per input and where a failing
    input is saved; counts of outcomes and mutations, and the slowest input."""

    def __init__(self, name: str, seed: int, per_input: float, save: Path) -> None:
        self.name, self.seed, self.per_input, self.save = name, seed, per_input, save
        self.inputs = 0
        self.outcomes: dict[str, int] = {}
        self.mutations: dict[str, int] = {}
        self.slowest = (0.0, "")
        signal.signal(signal.SIGALRM, _on_alarm)

    def run(self, exercise: Callable[[], str], data: bytes, origin: str, applied: list[str], clock: Callable[[], float]
            ) -> bool:
        """exercise() on one mutated input (`data`, from seed `origin` by `applied`), bounded in time. False
        when it raised or ran too long: the input is saved and the traceback printed."""
        self.inputs += 1
        for what in applied:
            self.mutations[what] = self.mutations.get(what, 0) + 1
        t0 = clock()
        signal.setitimer(signal.ITIMER_REAL, self.per_input)
        try:
            outcome = exercise()
        except BaseException as e:  # noqa: BLE001 -- every escape is the finding
            signal.setitimer(signal.ITIMER_REAL, 0)
            if isinstance(e, KeyboardInterrupt):
                raise
            self.save.mkdir(parents=True, exist_ok=True)
            saved = self.save / f"{self.name}-crash-{self.seed}-{self.inputs}"
            saved.write_bytes(data)
            why = f"took over {self.per_input:g} s" if isinstance(e, InputTimeout) else "raised"
            print(f"{self.name}: FAILED: input {self.inputs} (seed {origin}, mutations {applied}) {why}; "
                  f"saved to {saved}")
            traceback.print_exc(file=sys.stdout)
            return False
        signal.setitimer(signal.ITIMER_REAL, 0)
        took = clock() - t0
        if took > self.slowest[0]:
            self.slowest = (took, origin)
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1
        return True

    def summary(self, elapsed: float) -> None:
        elapsed = max(elapsed, 1e-9)
        print(f"{self.name}: {self.inputs} inputs in {elapsed:.0f} s ({self.inputs / elapsed:.0f}/s): "
              + ", ".join(f"{v} {k}" for k, v in sorted(self.outcomes.items())) + "; 0 failures")
        print(f"{self.name}: mutations applied: "
              + ", ".join(f"{v} {k}" for k, v in sorted(self.mutations.items())))
        print(f"{self.name}: slowest input {self.slowest[0] * 1000:.1f} ms (from {self.slowest[1]})")
