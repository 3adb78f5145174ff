"""Phases and markers from Python.

A phase names what the program is doing ("forward", "eval", "load") so that
every block allocated meanwhile is accounted to it. The current phase lives
in the C library and is process-wide, not per thread: the autograd engine
allocates on its own threads on behalf of the main thread's phase. Phases
nest; the innermost open one is current.

With several threads: the current phase is the one entered last and not
yet left, whichever thread entered it, and every allocation on every
thread belongs to it. Phases do not keep threads' allocations apart: two
threads inside two different phases at once both allocate into the one
entered last. A `phase()` block leaves exactly the occurrence it entered,
even when another thread entered a phase after it that is still open (it
is taken out of the middle; the innermost of the rest stays current).
`begin()`/`end()` work on the innermost phase only and must be balanced in
order; prefer `phase()`. docs/RELIABILITY.md ("Phases on several threads")
gives the cases.

    with torchalloc.phase("eval"):
        evaluate(model)

    @torchalloc.phase("load")
    def load_checkpoint(path): ...

    torchalloc.phase_stats()["eval"].live_peak_bytes
"""
from __future__ import annotations

import contextlib
import dataclasses
import threading
import warnings
from types import TracebackType

from . import _lib
from ._device import DeviceLike, device_index


def _encode_name(name: str) -> bytes:
    if not isinstance(name, str):
        raise TypeError(f"a phase name must be a str, got {type(name).__name__}")
    if "\0" in name:  # C would cut the name there and account to another phase
        raise ValueError(f"a phase name must not contain a NUL character, got {name!r}")
    raw = name.encode("utf-8")
    if not 1 <= len(raw) <= _lib.PHASE_NAME_MAX:
        raise ValueError(f"a phase name must be 1 to {_lib.PHASE_NAME_MAX} bytes, got {name!r}")
    return raw


def begin(name: str) -> int:
    """Enter phase `name`; returns its id. Prefer `phase(name)`, which cannot forget to end."""
    pid = _lib.lib().torchalloc_phase_begin(_encode_name(name))
    if pid < 0:
        raise RuntimeError(f"cannot begin phase {name!r}: {_lib.last_error()}")
    return int(pid)


def end(name: str | None = None) -> None:
    """Leave the innermost phase, which must be `name` when `name` is given.

    Only the innermost: with phases entered on several threads, use
    `phase()`, which leaves exactly the phase it entered.
    """
    raw = None if name is None else _encode_name(name)
    if _lib.lib().torchalloc_phase_end(raw) != 0:
        raise RuntimeError(_lib.last_error())


class phase(contextlib.ContextDecorator):
    """Context manager and decorator: allocations inside belong to phase `name`.

    Leaving the block leaves the occurrence this entry began, wherever it
    is among the open phases: if another thread entered a phase after it
    and is still inside, that one stays open and current (the phase is
    process-wide: see the module's docstring for what that means with
    several threads). The same object may be entered again while active
    (recursion, a decorated function called on several threads): each
    entry is left by its own exit on the same thread. If the body raises
    and leaving the phase fails too, the body's exception wins and the
    failure is reported as a warning.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self._raw = _encode_name(name)
        self._entries = threading.local()  # per thread: the tokens of the entries not yet left, innermost last

    def _tokens(self) -> list[int]:
        tokens: list[int] | None = getattr(self._entries, "tokens", None)
        if tokens is None:
            tokens = self._entries.tokens = []
        return tokens

    def __enter__(self) -> "phase":
        if not _lib.has("torchalloc_phase_enter"):  # a library from before phase tokens: innermost only
            begin(self.name)
            self._tokens().append(0)
            return self
        token = _lib.lib().torchalloc_phase_enter(self._raw, len(self._raw))
        if token < 0:
            raise RuntimeError(f"cannot begin phase {self.name!r}: {_lib.last_error()}")
        self._tokens().append(int(token))
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        tokens = self._tokens()
        token = tokens.pop() if tokens else 0
        if token:
            ok = _lib.lib().torchalloc_phase_leave(token) == 0
        else:
            ok = _lib.lib().torchalloc_phase_end(self._raw) == 0
        if ok:
            return
        message = f"cannot end phase {self.name!r}: {_lib.last_error()}"
        if exc_type is None:
            raise RuntimeError(message)
        warnings.warn(message, RuntimeWarning, stacklevel=2)

    def __repr__(self) -> str:
        return f"torchalloc.phase({self.name!r})"


def current_phase() -> str:
    """The name of the innermost open phase ("default" when none is open)."""
    return phase_name(_lib.lib().torchalloc_phase_current())


def phase_name(phase_id: int) -> str:
    raw: bytes | None = _lib.lib().torchalloc_phase_name(phase_id)
    if raw is None:
        raise ValueError(f"no phase has id {phase_id}")
    return raw.decode("utf-8", "replace")


def phase_names() -> list[str]:
    """Every phase name seen so far, by id (index 0 is "default")."""
    return [phase_name(i) for i in range(_lib.lib().torchalloc_phase_count())]


@dataclasses.dataclass(frozen=True)
class PhaseStats:
    """Accounting of one phase on one device (torchalloc_phase_stats).

    Bytes are block bytes (rounded as the policy rounds), like
    memory_allocated(). "persistent" bytes were allocated in the last
    occurrence of the phase and outlived it; "transient" ones were
    allocated and freed within it.
    """

    occurrences: int
    allocated_bytes: int
    allocated_count: int
    freed_bytes: int
    freed_count: int
    live_bytes: int
    live_peak_bytes: int
    peak_allocated_bytes: int
    reserved_growth_bytes: int
    reserved_released_bytes: int
    last_persistent_bytes: int
    last_transient_bytes: int


def _phase_stats_of(device: int, phase_id: int) -> PhaseStats:
    out = _lib.get_phase_stats(device, phase_id)
    return PhaseStats(**{field.name: int(getattr(out, field.name)) for field in dataclasses.fields(PhaseStats)})


def phase_stats(name: str | None = None, device: DeviceLike = None) -> dict[str, PhaseStats] | PhaseStats:
    """Per-phase accounting: all phases as {name: PhaseStats}, or one phase's PhaseStats."""
    index = device_index(device)
    if name is not None:
        names = phase_names()
        if name not in names:
            raise KeyError(f"no phase named {name!r} has been seen (known: {', '.join(names)})")
        return _phase_stats_of(index, names.index(name))
    return {n: _phase_stats_of(index, i) for i, n in enumerate(phase_names())}


_warned_marks: set[str] = set()


def _warn_once(reason: str) -> None:
    if reason not in _warned_marks:
        _warned_marks.add(reason)
        warnings.warn(f"torchalloc.mark: marker dropped: {reason}", RuntimeWarning, stacklevel=3)


def mark(label: str) -> bool:
    """Write a marker with `label` into the event log, to find a moment in a trace.

    Returns True when written. A marker is a debugging aid, so one that
    cannot be written never raises: with no log open it returns False
    silently (logging is often switched on only for some runs); with a
    library built without the event log it returns False and warns once.
    """
    if not isinstance(label, str):
        raise TypeError(f"a marker label must be a str, got {type(label).__name__}")
    if "\0" in label:  # C would cut the label there
        raise ValueError(f"a marker label must not contain a NUL character, got {label!r}")
    if not _lib.has("torchalloc_mark"):
        _warn_once("this libtorchalloc has no event log (torchalloc_mark is missing)")
        return False
    if _lib.has("torchalloc_log_path") and _lib.lib().torchalloc_log_path() is None:
        return False
    if _lib.lib().torchalloc_mark(label.encode("utf-8")) != 0:
        _warn_once(_lib.last_error() or "torchalloc_mark failed")
        return False
    return True
