"""A log's string table, kept as bytes and decoded when asked.

The writer interns each distinct phase name, marker label, module path and
file and function name once, as one or more STRING slots (46 text bytes
each, docs/LOG_FORMAT.md); records name them by id. A log may hold
millions (a hand-made one, or a run marking every step with a new label),
most never printed: a report prints the labels, phases and frames it
shows. Decoded up front into a dict of str, 2^20 one-slot strings took
report 795 MB for a 64 MB log (1.1 GB when each lacked a chunk). Here each
string is one bytes object under its id, decoded only when looked up: a
string of n bytes costs about 110 + n bytes (its id, its bytes object, the
dict's entry), at most three times its 64-byte slot, so the table stays
within three times the log's string records whatever the log says. A
string whose chunks have not all come keeps them apart until they do, and
is shown as far as it goes.
"""
from __future__ import annotations

import struct
from typing import Iterator, Mapping

import numpy as np

_U16 = struct.Struct("<H")
MISSING_LISTED = 5  # strings named in the note about strings missing chunks; the rest are counted


class StringTable(Mapping[int, str]):
    """Strings by id, from STRING slots handed to `add` in file order (`chunk_bytes`: the text bytes of a slot)."""

    def __init__(self, chunk_bytes: int) -> None:
        self.chunk_bytes = chunk_bytes
        self._whole: dict[int, bytes] = {}  # complete strings, cut to their length
        # The rest, each in one bytearray: its length (2 bytes), then each chunk come so far as its number (2
        # bytes) and its text: a few objects each would cost twice as much (a tuple, a dict, a bytes a chunk).
        self._parts: dict[int, bytearray] = {}

    def add(self, slots: np.ndarray) -> None:
        """Take STRING slots viewed as format.STRING_DTYPES (fields id, len, chunk, text)."""
        chunk_bytes = self.chunk_bytes
        texts = slots["text"].tobytes()  # one copy of the piece's text, sliced once a string: no garbage between
        whole, parts = self._whole, self._parts
        for i, (sid, length, chunk) in enumerate(zip(slots["id"].tolist(), slots["len"].tolist(),
                                                      slots["chunk"].tolist())):
            at = i * chunk_bytes
            if chunk == 0 and length <= chunk_bytes and sid not in parts:  # one slot: the common case
                text = texts[at:at + length]
                if whole.get(sid) != text:  # a later pass adds the same slots again: the first copy stays
                    whole[sid] = text
                continue
            packed = parts.get(sid)
            got = self._chunks(packed) if packed is not None else {}
            got[chunk] = texts[at:at + chunk_bytes]
            needed = (length + chunk_bytes - 1) // chunk_bytes or 1
            if len(got) >= needed and all(c in got for c in range(needed)):
                whole[sid] = b"".join(got[c] for c in range(needed))[:length]
                parts.pop(sid, None)
            else:
                packed = bytearray(_U16.pack(length))
                for c, text in got.items():
                    packed += _U16.pack(c) + text
                parts[sid] = packed

    def _chunks(self, packed: bytearray) -> dict[int, bytes]:
        step = 2 + self.chunk_bytes
        return {_U16.unpack_from(packed, at)[0]: bytes(packed[at + 2:at + step]) for at in range(2, len(packed), step)}

    def __getitem__(self, sid: int) -> str:
        raw = self._whole.get(sid)
        if raw is None:
            packed = self._parts[sid]  # KeyError: no such string
            got = self._chunks(packed)
            raw = b"".join(got[c] for c in sorted(got))[:_U16.unpack_from(packed)[0]]  # as far as it goes
        return raw.decode("utf-8", "replace")

    def __contains__(self, sid: object) -> bool:
        return sid in self._whole or sid in self._parts

    def __iter__(self) -> Iterator[int]:
        yield from self._whole
        yield from self._parts

    def __len__(self) -> int:
        return len(self._whole) + len(self._parts)

    def missing_chunks(self) -> list[int]:
        """The ids of strings some of whose chunks never came, in the order they were first seen."""
        return list(self._parts)

    def missing_note(self) -> str | None:
        """One line about the strings missing chunks (naming the first few), or None when none is."""
        missing = self.missing_chunks()
        if not missing:
            return None
        named = ", ".join(str(sid) for sid in missing[:MISSING_LISTED])
        more = f" and {len(missing) - MISSING_LISTED} more" if len(missing) > MISSING_LISTED else ""
        return (f"{len(missing)} string{'s are' if len(missing) > 1 else ' is'} missing chunks "
                f"({'ids' if len(missing) > 1 else 'id'} {named}{more}); shown as far as they go")
