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
        ({"device_traces": [[{"action": []}]]}, "no 'action' string"),  # unhashable: once a TypeError
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


# ---------------------------------------------------------------------------
# Shared references (issue 36, finding B)
# ---------------------------------------------------------------------------


def _block(size: int = 512) -> dict[str, Any]:
    return {"size": size, "requested_size": size, "state": "active_allocated", "frames": []}


def _shared_blocks(segments: int, blocks: int) -> dict[str, Any]:
    """`segments` segments that all name one list of `blocks` blocks: pickled, the list is written once and
    named by a memo reference (a few bytes) from every segment after the first."""
    shared = [_block() for _ in range(blocks)]
    return {"device_traces": [[{"action": "alloc", "addr": 16, "size": 512}]],
            "segments": [{"device": 0, "address": i << 32, "total_size": 512 * blocks, "stream": 0,
                          "blocks": shared} for i in range(segments)]}


def _refused_cheaply(path: Path, message: str) -> None:
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(TraceError, match=message):
            trace.load_trace(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, f"refusing it took {peak >> 20} MiB"  # xz alone decodes with an 8 MiB dictionary


def test_a_blocks_list_shared_by_segments_is_refused(tmp_path: Path) -> None:
    """1000 segments naming one list of 100 blocks: 100,000 blocks walked from a 33 KB pickle; the square
    case (one segment named 4000 times, with 4000 references to one block) is 16 KB and was 16 million
    blocks, 3.8 GB and 23 s. Both are refused at the second reference, in one line."""
    raw = pickle.dumps(_shared_blocks(1000, 100))
    assert len(raw) < 40_000
    path = tmp_path / "shared.pickle"
    path.write_bytes(raw)
    _refused_cheaply(path, r"segments\[1\] has the blocks list of segments\[0\] \(a shared reference")
    block = _block()
    segment = {"device": 0, "address": 0, "total_size": 512, "blocks": [block] * 4000}
    square = pickle.dumps({"device_traces": [[{"action": "alloc", "addr": 16, "size": 512}]],
                           "segments": [segment] * 4000})
    assert len(square) < 20_000
    path.write_bytes(square)
    _refused_cheaply(path, r"segments\[0\]\.blocks\[1\] is segments\[0\]\.blocks\[0\] again")  # its shared block
    xz = tmp_path / "shared.pickle.xz"  # unpickled as it is inflated: the same refusal
    xz.write_bytes(lzma.compress(raw))
    _refused_cheaply(xz, r"has the blocks list of segments\[0\]")
    status, out, err = run_main(str(xz))  # run_main adds the exit status on a line of its own
    assert status == 2 and out == "" and "Traceback" not in err
    assert err.startswith("torchalloc replay: error: ") and "shared reference" in err.splitlines()[0]


def test_shared_frames_strings_and_empty_lists_still_load() -> None:
    """What PyTorch itself shares stays allowed: one frames list (and its frame dicts) for every entry with
    the same traceback (py_symbolize deduplicates them), repeated file names, and an empty list."""
    frame = {"filename": "/home/u/train.py", "line": 10, "name": "step"}
    frames = [frame, {"filename": "/home/u/train.py", "line": 3, "name": "main"}]
    entries = []
    for i in range(50):
        entries.append({"action": "alloc", "addr": 4096 * i, "size": 512, "stream": 0, "frames": frames})
        entries.append({"action": "free_completed", "addr": 4096 * i, "size": 512, "stream": 0, "frames": frames})
    live = dict(_block(), frames=frames)
    empty: list[Any] = []
    segments = [{"device": 0, "address": 1 << 40, "total_size": 512, "stream": 0, "blocks": [live], "frames": empty},
                {"device": 0, "address": 2 << 40, "total_size": 0, "stream": 0, "blocks": empty, "frames": empty}]
    raw = pickle.dumps({"device_traces": [entries], "segments": segments})
    assert raw.count(b"train.py") == 1  # the pickle does share them
    t = trace.from_snapshot(trace.safe_unpickle(raw))
    assert len(t) == 101 and t.prelude == 1


def _refusal_peak(data: bytes, message: str) -> int:
    import tracemalloc

    tracemalloc.start()
    try:
        with pytest.raises(TraceError, match=message):
            trace.from_snapshot(trace.safe_unpickle(data, "memo.pickle"))
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("data", [
    b"\x80\x02}r" + (1 << 24).to_bytes(4, "little") + b".",  # LONG_BINPUT: CPython's memo array grows to 2x it
    b"(dp16777216\n.",  # PUT, protocol 0
    b"(dp1e9\n.",  # PUT of an index that is no plain number
    b"]replace.",  # CPython's gh-115952: 'r' takes "epla" as an index of 1.6 billion
])
def test_a_memo_index_beyond_the_bytes_before_it_is_refused(data: bytes) -> None:
    """CPython's C unpickler keeps its memo in an array as long as the largest index stored: 9 bytes with an
    index of 2^30 took 16.8 GB and 46 s (2^24 here: 256 MiB before the check). No pickler writes an index
    larger than the bytes before it, so the memo stays within 16 bytes a byte of pickle."""
    peak = _refusal_peak(data, r"memo.pickle: malformed pickle: it stores (object \d+|an object under an index "
                               r"that is no number) at byte \d+: no pickler")
    assert peak < 1 << 20
    # The index a pickler writes next (the objects memoized before it) stays allowed; one beyond it is refused
    # even where it is below the bytes before it (issue 47: a compressed pickle has bytes to spare).
    assert trace.safe_unpickle(b"\x80\x02]q\x00(K\x01r\x01\x00\x00\x00e.") == [1]
    with pytest.raises(TraceError, match=r"it stores object 5 at byte 8: no pickler numbers objects out of order "
                                         r"\(the next is 1\)"):
        trace.safe_unpickle(b"\x80\x02]q\x00(K\x01r\x05\x00\x00\x00e.")


def test_a_pickle_cut_inside_a_declared_size_is_refused_before_unpickling() -> None:
    """BYTEARRAY8 declaring 10^18 bytes in a pickle of 20: refused from the bytes there are, before the
    unpickler reserves the size (which made CPython print 'deallocated bytearray object has exported
    buffers')."""
    data = b"\x80\x05\x96" + (10**18).to_bytes(8, "little") + b"abc"
    assert _refusal_peak(data, r"memo.pickle: truncated pickle \(ends before its STOP opcode\)") < 1 << 20


def test_pickles_of_every_protocol_still_load(tmp_path: Path) -> None:
    """Over 256 memoized objects: protocols 1 to 3 number them with LONG_BINPUT, 0 with PUT, 4 and 5 with
    MEMOIZE; each loads the same, whole, compressed, and checked in pieces cut anywhere."""
    from torchalloc.log.trace_snapshot import _MemoCheck

    frames = [{"filename": "/home/u/train.py", "line": 1, "name": "f"}]
    entries = [{"action": "alloc", "addr": 4096 * i, "size": 512, "frames": frames} for i in range(300)]
    snapshot = {"device_traces": [entries], "segments": []}
    want = trace.from_snapshot(snapshot)
    for protocol in range(6):
        raw = pickle.dumps(snapshot, protocol=protocol)
        path = tmp_path / f"p{protocol}.pickle.xz"
        path.write_bytes(lzma.compress(raw))
        assert (trace.load_trace(path).events == want.events).all(), protocol
        for size in (1, 2, 5, 64):
            check = _MemoCheck("pieces")
            for at in range(0, len(raw), size):
                check.feed(raw[at:at + size])
            check.finish()  # reached STOP: nothing refused
