"""What the tools make of fixed logs, for the golden test: `torchalloc report` (text, --json, --html), `export`
(the snapshot) and `replay --json --no-search`.

The logs: the bundled traces, the reclaim log in data/, and the hand-made
scenarios of test_streamed.py written as files with a fixed start time.
Each is copied under a fixed name into one folder and reported from there,
so no temporary path reaches the output.

    python3 python/tests/report_golden.py --write   # record today's outputs in data/report_golden.json

Record only when a report is meant to change, and say so in the commit.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import os
import sys
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "data" / "report_golden.json"
DATA = HERE.parent / "torchalloc" / "data"
FIXED_LOGS = {
    "demo.talog": DATA / "demo_trace.talog.xz",
    "phases.talog": DATA / "phases_trace.talog.xz",
    "reclaim.talog": HERE / "data" / "reclaim_demo.talog.xz",
}


def scenarios() -> dict[str, Callable[[], object]]:
    sys.path.insert(0, str(HERE))
    from test_streamed import SCENARIOS

    return {f"{name}.talog": make for name, make in SCENARIOS.items()}


def write_logs(folder: Path) -> list[str]:
    """Every log of the golden set in `folder`; their names, in a fixed order."""
    from synthfile import write_log

    for name, packed in FIXED_LOGS.items():
        (folder / name).write_bytes(lzma.decompress(packed.read_bytes()))
    for name, make in scenarios().items():
        write_log(make(), folder / name, start_ns=10**9)
    return sorted(os.listdir(folder))


# What each output is: the verb and its arguments, and the file it writes (else its stdout).
OUTPUTS = {
    "text": (["report", "{log}"], None),
    "json": (["report", "--json", "{log}"], None),
    "html": (["report", "--html", "page.html", "{log}"], "page.html"),
    "export": (["export", "{log}", "-o", "snap.pickle", "--max-entries", "0"], "snap.pickle"),
    "replay": (["replay", "--json", "--no-search", "{log}"], None),
}


def reports(folder: Path, name: str) -> dict[str, str]:
    """Each output of OUTPUTS for `folder/name`, run from `folder` (a file's bytes as latin-1 text)."""
    from cli_in_process import cli

    here, columns = os.getcwd(), os.environ.get("COLUMNS")
    os.chdir(folder)
    os.environ["COLUMNS"] = "100"  # the text fits the terminal: recorded at the width a pipe gets
    try:
        out: dict[str, str] = {}
        for fmt, (args, written) in OUTPUTS.items():
            argv = [a.format(log=name) for a in args]
            status, stdout, stderr = cli(*argv)
            if status != 0:
                raise AssertionError(f"torchalloc {' '.join(argv)}: exit {status}: {stderr}")
            out[fmt] = Path(written).read_bytes().decode("latin-1") if written else stdout
        return out
    finally:
        os.chdir(here)
        if columns is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = columns


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def record(folder: Path) -> dict[str, dict[str, str]]:
    """Per log: the text report whole (a failing test shows its diff), every other output by its sha256."""
    golden = {}
    for name in write_logs(folder):
        r = reports(folder, name)
        golden[name] = {"text": r["text"], **{f"{fmt}_sha256": digest(r[fmt]) for fmt in OUTPUTS if fmt != "text"}}
    return golden


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"record today's reports in {GOLDEN}")
    args = parser.parse_args()
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        golden = record(Path(d))
    if args.write:
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
        print(f"wrote {GOLDEN} ({len(golden)} logs)")
    else:
        print(json.dumps({k: {f: d for f, d in v.items() if f != "text"} for k, v in golden.items()}, indent=1))


if __name__ == "__main__":
    main()
