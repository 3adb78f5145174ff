"""The README's TORCHALLOC_CONF table and `torchalloc info --keys` say what the parser does (issue 34, item 4).

Every key is one row of the table in allocator/context/config.c (its kind,
range, field, default and a line of help); the library describes that table
through torchalloc_config_help. `info --keys` prints the description. The
README's table is prose a person writes (its meaning column says more than
the library's one line), so it is checked rather than generated: one row per
key, none missing or extra, and, with backticks dropped, its values column
says exactly what the library says the key takes (the words of the key's
error message), its default column starts with the library's default and
its meaning column with the library's line of help.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cli_in_process import cli  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
SECTION = "## Configuration: `TORCHALLOC_CONF`"


def readme_rows(text: str) -> dict[str, dict[str, str]]:
    """The key table of the README's configuration section, by key, backticks dropped."""
    start = text.index(SECTION)
    end = text.find("\n## ", start + len(SECTION))
    rows: dict[str, dict[str, str]] = {}
    for line in text[start:end if end >= 0 else len(text)].splitlines():
        if not line.startswith("| `"):  # the header, its rule and the prose around the table
            continue
        cells = [cell.strip().replace("`", "") for cell in line.strip().strip("|").split(" | ")]
        assert len(cells) == 4, f"README row is not key | values | default | meaning: {line[:120]}"
        key = cells[0]
        assert key not in rows, f"README lists the key {key} twice"
        rows[key] = dict(zip(("values", "default", "meaning"), cells[1:]))
    return rows


@pytest.fixture(scope="module")
def library_keys(library_path: Path) -> dict[str, dict[str, str]]:
    from torchalloc import _lib

    return {row["key"]: row for row in _lib.config_help()}


def test_the_description_lists_the_keys_the_parser_takes(library_keys: dict[str, dict[str, str]]) -> None:
    from torchalloc import _lib

    assert list(library_keys) == _lib.config_keys()
    assert all(row["values"] and row["default"] and row["help"] for row in library_keys.values())
    assert library_keys["sim_lag"]["values"] == "an integer from 0 to 1000000000"  # it once said "0 to 0"


def test_readme_has_one_row_per_key(library_keys: dict[str, dict[str, str]]) -> None:
    documented = readme_rows(README.read_text())
    assert not set(library_keys) - set(documented), "keys the README's table leaves out"
    assert not set(documented) - set(library_keys), "README rows for keys the parser does not know"


def mismatches(text: str, library_keys: dict[str, dict[str, str]]) -> list[str]:
    """Where the README's table says something other than the library, one sentence each."""
    found = []
    for key, row in readme_rows(text).items():
        lib = library_keys.get(key)
        if lib is None:
            continue
        if row["values"] != lib["values"]:
            found.append(f"{key}: the README says it takes {row['values']!r}; the library says {lib['values']!r}")
        if row["default"] != lib["default"] and not row["default"].startswith(lib["default"] + " ("):
            found.append(f"{key}: the README's default is {row['default']!r}; the library's is {lib['default']!r}")
        if not row["meaning"].startswith(lib["help"]):
            found.append(f"{key}: the README's meaning does not start with the library's help {lib['help']!r}")
    return found


def test_readme_rows_say_what_the_library_says(library_keys: dict[str, dict[str, str]]) -> None:
    assert mismatches(README.read_text(), library_keys) == []


def test_a_readme_row_that_drifts_is_found(library_keys: dict[str, dict[str, str]]) -> None:
    text = README.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| `sim_devices` |"))
    for drifted in (row.replace("an integer from 1 to 64", "1-64"), row.replace("| 1 |", "| 2 |"),
                    row.replace("number of simulated devices", "simulated devices")):
        assert drifted != row
        found = mismatches(text.replace(row, drifted), library_keys)
        assert len(found) == 1 and found[0].startswith("sim_devices: "), found


def test_info_keys_prints_the_library_description(library_keys: dict[str, dict[str, str]]) -> None:
    status, out, err = cli("info", "--keys")
    assert status == 0, err
    words = " ".join(out.split())  # lines wrapped to $COLUMNS (test_output_width.py checks that)
    for key, row in library_keys.items():
        assert f"\n  {key}: " in out  # each key opens its own line (a long description wraps after it)
        assert " ".join(f"{key}: {row['values']} (default: {row['default']}) {row['help']}".split()) in words
    status, out, err = cli("info", "--keys", "--json")
    assert status == 0, err
    assert json.loads(out) == list(library_keys.values())
