"""Snapshots that try to run code, are cut short, malformed or hostile: each is refused with a clear
TraceError and nothing in it runs (the loader's restricted unpickler, trace_snapshot.py)."""
from __future__ import annotations

import gzip
import lzma
import os
import pickle
from pathlib import Path
from typing import Any

import pytest
from test_replay import run_main

from torchalloc.log import trace
from torchalloc.log.trace import TraceError

SNAPSHOT = Path(__file__).resolve().parent / "data" / "small_snapshot.pickle"


# ---------------------------------------------------------------------------
# Hostile, truncated and malformed input
# ---------------------------------------------------------------------------


class _Evil:
    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[Any, tuple[str]]:
        return (os.system, (self.command,))


def _hostile_pickles(marker: Path) -> dict[str, bytes]:
    cmd = f"touch {marker}"
    return {
        # protocol 0, by hand: GLOBAL posix/os.system, REDUCE
        "protocol0": f"cos\nsystem\n(S'{cmd}'\ntR.".encode(),
        # what pickle.dumps makes of an object whose __reduce__ names os.system (STACK_GLOBAL)
        "protocol4": pickle.dumps(_Evil(cmd), protocol=4),
        # hidden inside a snapshot-looking dict
        "nested": pickle.dumps({"device_traces": [[{"action": "alloc", "addr": _Evil(cmd)}]]}, protocol=2),
        # builtins.eval through INST
        "inst": f"(S'__import__(\"os\").system(\"{cmd}\")'\nibuiltins\neval\n.".encode(),
    }


@pytest.mark.parametrize("kind", ["protocol0", "protocol4", "nested", "inst"])
def test_hostile_pickle_is_refused_and_not_run(tmp_path: Path, kind: str) -> None:
    marker = tmp_path / "pwned"
    path = tmp_path / "evil.pickle"
    path.write_bytes(_hostile_pickles(marker)[kind])
    with pytest.raises(TraceError, match="refusing to unpickle"):
        trace.load_trace(path)
    assert not marker.exists()
    # The same through the command line: a clear error, exit status 2.
    status, out, err = run_main(str(path))
    assert status == 2 and "refusing to unpickle" in err and out == ""
    assert not marker.exists()
    # Compressed, the same.
    xz = tmp_path / "evil.pickle.xz"
    xz.write_bytes(lzma.compress(path.read_bytes()))
    with pytest.raises(TraceError, match="refusing"):
        trace.load_trace(xz)
    assert not marker.exists()


def test_plain_pickle_would_have_run_it(tmp_path: Path) -> None:
    """The hostile fixture is real: plain pickle.loads does run it (so the test above means something)."""
    marker = tmp_path / "pwned"
    pickle.loads(_hostile_pickles(marker)["protocol4"])
    assert marker.exists()


def test_truncated_pickle(tmp_path: Path) -> None:
    raw = SNAPSHOT.read_bytes()
    for cut in (1, 2, len(raw) // 3, len(raw) // 2, len(raw) - 1):
        p = tmp_path / f"cut{cut}.pickle"
        p.write_bytes(raw[:cut])
        with pytest.raises(TraceError, match="truncated|malformed"):
            trace.load_trace(p)


def test_truncated_compressed_file(tmp_path: Path) -> None:
    raw = lzma.compress(SNAPSHOT.read_bytes())
    p = tmp_path / "cut.pickle.xz"
    p.write_bytes(raw[: len(raw) // 2])
    with pytest.raises(TraceError, match="truncated or corrupt"):
        trace.load_trace(p)
    g = gzip.compress(SNAPSHOT.read_bytes())
    p.write_bytes(g[: len(g) // 2])
    with pytest.raises(TraceError, match="truncated or corrupt"):
        trace.load_trace(p)


def test_garbage_and_missing_files(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="no such file"):
        trace.load_trace(tmp_path / "absent.pickle")
    with pytest.raises(TraceError, match="is a directory"):
        trace.load_trace(tmp_path)
    empty = tmp_path / "empty.pickle"
    empty.write_bytes(b"")
    with pytest.raises(TraceError, match="empty file"):
        trace.load_trace(empty)
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    with pytest.raises(TraceError, match="neither a PyTorch memory snapshot"):
        trace.load_trace(text)
    junk = tmp_path / "junk.pickle"
    junk.write_bytes(b"\x80\x04\x95\xff\xff\xff\xff\xff\xff\xff\x7f" + os.urandom(64))
    with pytest.raises(TraceError, match="truncated|malformed"):
        trace.load_trace(junk)


@pytest.mark.parametrize(
    "snapshot, message",
    [
        ([1, 2, 3], "not a PyTorch memory snapshot"),
        ({"segments": []}, "not a PyTorch memory snapshot"),
        ({"device_traces": "x"}, "not a list"),
        ({"device_traces": [[]]}, "device_traces are empty"),
        ({"device_traces": [[42]]}, r"device_traces\[0\]\[0\] is a int"),
        ({"device_traces": [[{"addr": 1}]]}, "no 'action'"),
        ({"device_traces": [[{"action": "alloc", "size": 512}]]}, "no 'addr'"),
        ({"device_traces": [[{"action": "alloc", "addr": "0x10", "size": 512}]]}, "'addr' is str"),
        ({"device_traces": [[{"action": "alloc", "addr": 16, "size": -5}]]}, "negative or larger"),
        ({"device_traces": [[{"action": "alloc", "addr": 16, "size": 1 << 50}]]}, "negative or larger"),
        ({"device_traces": [[{"action": "alloc", "addr": 16, "size": 1.5}]]}, "'size' is float"),
        ({"device_traces": [[{"action": "free_completed", "addr": None}]]}, "no 'addr'"),
        ({"device_traces": [[{"action": "segment_alloc", "addr": 1}]]}, "no 'size'"),
        ({"device_traces": [[{"action": "alloc", "addr": 1, "size": 1}]], "segments": [7]}, r"segments\[0\] is a int"),
        # Sizes that would overflow the int64 reserved curve (2**80 ended in OverflowError).
        ({"device_traces": [[{"action": "segment_alloc", "addr": 1, "size": 1 << 80}]]}, "negative or larger"),
        ({"device_traces": [[{"action": "alloc", "addr": 1, "size": 1}]],
          "segments": [{"address": 0, "total_size": 1 << 80, "blocks": []}]}, "'total_size' .* (larger than|beyond) any device"),
        ({"device_traces": [[{"action": "alloc", "addr": 1, "size": 1}]],
          "segments": [{"address": 0, "total_size": 512, "blocks": [{"size": 1 << 80}]}]}, "'size' .* (larger than|beyond) any device"),
        ({"device_traces": [[{"action": "alloc", "addr": 1 << 70, "size": 1}]], "segments": []}, None),
        ({"device_traces": [[{"action": "alloc", "addr": 1, "size": 1}]],
          "segments": [{"address": 1 << 70, "total_size": 512}]}, "'address' is .*beyond any device"),
    ],
)
def test_malformed_snapshots(tmp_path: Path, snapshot: Any, message: str | None) -> None:
    p = tmp_path / "bad.pickle"
    p.write_bytes(pickle.dumps(snapshot))
    if message is None:  # masked to 64 bits like a real address: loads
        assert len(trace.load_trace(p)) == 1
        return
    with pytest.raises(TraceError, match=message):
        trace.load_trace(p)


def test_deeply_nested_value_gets_a_clear_error(tmp_path: Path) -> None:
    """A value nested 200,000 levels deep in an entry: the error describes it without repr() (which raised
    RecursionError), and the unpickler itself (iterative) builds it."""
    marker = 0x7A7A7A7A
    raw = pickle.dumps({"device_traces": [[{"action": "alloc", "addr": 16, "size": marker}]]}, protocol=2)
    packed = b"J" + marker.to_bytes(4, "little")  # BININT: the opcode pickle writes for this int
    nested = b"]" * 200_000 + b"a" * 199_999  # EMPTY_LIST x N, then APPEND each into the one before
    p = tmp_path / "deep.pickle"
    p.write_bytes(raw.replace(packed, nested))
    with pytest.raises(TraceError, match="'size' is a list of 1 items, not an integer"):
        trace.load_trace(p)


def test_unknown_actions_are_noted_not_fatal() -> None:
    snap = {"device_traces": [[{"action": "alloc", "addr": 1, "size": 512}, {"action": "teleport", "addr": 1}]]}
    t = trace.from_snapshot(snap)
    assert len(t) == 1 and any("teleport x1" in n for n in t.notes)
