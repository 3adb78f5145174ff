"""The one formatter module: every report, table and note prints bytes and times through it."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from torchalloc import units  # noqa: E402


@pytest.mark.parametrize(
    "n, decimals, unit, text",
    [
        (3 << 29, 1, None, "1.5 GiB"),
        (32 << 20, 1, None, "32.0 MiB"),
        (1536, 1, None, "1.5 KiB"),
        (512, 1, None, "512 B"),
        (0, 1, None, "0 B"),
        (-(3 << 20), 1, None, "-3.0 MiB"),  # a shrinking figure keeps its unit
        (3 << 29, 2, None, "1.50 GiB"),  # replay's table
        (700 << 10, 1, "MiB", "0.7 MiB"),  # compare's table below 1 GiB
        (None, 1, None, "-"),
        (None, 2, "MiB", "-"),
    ],
)
def test_fmt_bytes(n: int | None, decimals: int, unit: str | None, text: str) -> None:
    assert units.fmt_bytes(n, decimals, unit=unit) == text


def test_byte_unit() -> None:
    assert units.byte_unit(5 << 30) == ("GiB", units.GiB)
    assert units.byte_unit(1 << 20) == ("MiB", units.MiB)
    assert units.byte_unit(1023) == ("B", 1)


@pytest.mark.parametrize(
    "s, text", [(12e-6, "12 µs"), (3.4e-3, "3.4 ms"), (1.25, "1.25 s"), (-1.0, "until the end")]
)
def test_fmt_seconds(s: float, text: str) -> None:
    assert units.fmt_seconds(s) == text


def test_fmt_time_and_axis() -> None:
    assert units.fmt_time(1.25) == "t=1.250 s"
    assert units.fmt_time(3.4e-3) == "t=3.4 ms"
    assert units.fmt_axis_seconds(0.0005, 1e-3) == "500 µs"
    assert units.fmt_axis_seconds(0.25, 1.0) == "250 ms"
    assert units.fmt_axis_seconds(5.0, 30.0) == "5 s"


def test_parse_bytes_refuses_what_is_not_a_size() -> None:
    with pytest.raises(ValueError, match="not a size"):
        units.parse_bytes("lots")
