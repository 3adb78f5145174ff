"""The Python mirrors of C facts (torchalloc._records) equal the C sources.

The log decoder must work where the C library is not (reading a log on a
laptop), so record kinds and policy names are written on both sides; these
tests make the two copies one fact: they fail as soon as either side moves.
"""
from __future__ import annotations

import re
from pathlib import Path

from torchalloc import _lib, _records

REPO = Path(__file__).resolve().parents[2]


def test_record_kinds_equal_the_c_enum() -> None:
    text = (REPO / "allocator" / "log" / "log_format.h").read_text()
    body = re.search(r"enum ta_log_kind \{(.*?)\};", text, re.S)
    assert body, "enum ta_log_kind not found in allocator/log/log_format.h"
    c_kinds = {int(v): name.lower() for name, v in re.findall(r"TA_LOG_([A-Z_]+)\s*=\s*(\d+)", body.group(1))}
    c_kinds.pop(0)  # TA_LOG_NONE: a slot not written yet, never a record
    assert c_kinds == _records.KIND_NAMES


def test_policy_ids_equal_the_c_registry(sim: object) -> None:
    assert _lib.policy_names() == [_records.POLICY_NAMES[i] for i in range(len(_records.POLICY_NAMES))]


def test_header_field_offsets_equal_the_c_struct() -> None:
    """The decoder's header layout puts rank and world_size where log_format.h's asserts do."""
    import struct

    from torchalloc.log.format import HEADER_STRUCT

    text = (REPO / "allocator" / "log" / "log_format.h").read_text()
    offsets = {name: int(v) for name, v in re.findall(r"#define TA_LOG_HEADER_([A-Z_]+)_OFFSET (\d+)", text)}
    fmt = HEADER_STRUCT.format
    # The bytes of the fields before rank, and before world_size (the last), are their offsets.
    assert struct.calcsize(fmt[:10]) == offsets["RANK"]  # "<8sIIIIQQI": everything before rank
    assert struct.calcsize(fmt[: len(fmt) - 1]) == offsets["WORLD_SIZE"]
    assert HEADER_STRUCT.size == offsets["WORLD_SIZE"] + 4
