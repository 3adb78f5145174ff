"""The last out-of-memory failure, as torchalloc saw it: torchalloc.last_oom().

    try:
        train_step()
    except torch.OutOfMemoryError:
        oom = torchalloc.last_oom()
        print(oom.verdict, oom.summary)   # "fragmentation", "CUDA out of memory. Tried to ..."
        print(oom.report)                 # the full report: segment map, blocks that pin them, sites, ages
        first = oom.advice[0]             # "expandable:reclaim would have served this request: ... [based on ...]"
        print(first.setting, first.conf)  # "expandable:reclaim", {"expandable": "reclaim"}: install(**first.conf)

The numbers, the verdict and both texts come from the C core, which built
them at the failure while the heap still looked as it did (the report is
also in the file `oom.path` names). The advice is computed from those
numbers, one line per thing to try, the first first; each line names the
figures behind it ("[based on ...]"), and `parse_advice` reads the lines
back from any text that has them (the OutOfMemoryError message included). With a log open, `torchalloc report LOG`
adds the check by replay: how much each policy would have needed for the run
up to the failure, and whether it fits.

Runtime module: no numpy, no tools.
"""
from __future__ import annotations

import dataclasses
import re

from . import _lib
from ._device import DeviceLike, device_index


@dataclasses.dataclass(frozen=True)
class OomReport:
    device: int
    verdict: str  # "fragmentation", "capacity" or "held elsewhere"
    requested: int
    allocated: int
    reserved: int
    device_total: int
    device_free: int
    limit: int  # the memory fraction's ceiling in bytes, 0 for none
    largest_free: int  # largest free cached block on the request's stream
    summary: str  # one paragraph, as the OutOfMemoryError message says it, then the advice lines
    report: str  # the full text
    path: str  # where the report was written ("" when nowhere)
    detail: dict[str, object] = dataclasses.field(default_factory=dict)  # what the advice rests on (_lib.OOM_DETAIL_FIELDS)

    @property
    def advice(self) -> list["Advice"]:
        """The advice lines of the summary, the first to try first."""
        return parse_advice(self.summary)

    @property
    def free_in_reserved(self) -> int:
        return max(0, self.reserved - self.allocated)

    def __str__(self) -> str:
        return self.report


def last_oom(device: DeviceLike = None) -> OomReport | None:
    """The last request torchalloc could not serve on `device`, or None when there was none."""
    index = device_index(device)
    found = _lib.last_oom(index)
    if found is None:
        return None
    facts, verdict = found
    return OomReport(index, verdict, summary=_lib.oom_summary(index), report=_lib.oom_report(index),
                     path=_lib.oom_report_path(index), detail=_lib.last_oom_detail(index) or {}, **facts)


# ---------------------------------------------------------------------------
# Advice lines
# ---------------------------------------------------------------------------

# "2. expandable:reclaim would have served this request: ... [based on ...]"
_LINE = re.compile(r"^\s*(\d+)\. (.*\[based on (.*)\])\s*$")
# A TORCHALLOC_CONF entry at the start of a line: "expandable:reclaim", "policy:phase_arena".
_SETTING = re.compile(r"^([a-z_]+):([A-Za-z0-9_.]+)\b")


@dataclasses.dataclass(frozen=True)
class Advice:
    """One line of an OOM's advice."""

    number: int
    text: str  # the line without its number
    basis: str  # what its figures rest on (the "[based on ...]" part)
    setting: str | None  # the TORCHALLOC_CONF entry it says to try ("expandable:reclaim"); None: not a setting

    @property
    def serves(self) -> bool | None:
        """Whether its figures say the setting would have served the request (None: the line does not say)."""
        if "would not have served" in self.text:
            return False
        return True if "would have served" in self.text else None

    @property
    def conf(self) -> dict[str, str]:
        """The setting as TORCHALLOC_CONF keys ({"expandable": "reclaim"}), for torchalloc.install(**conf)."""
        if not self.setting:
            return {}
        key, value = self.setting.split(":", 1)
        return {key: value}

    def __str__(self) -> str:
        return f"{self.number}. {self.text}"


def parse_advice(text: str) -> list[Advice]:
    """The advice lines in `text` (a summary, an OutOfMemoryError message, a report), in their order."""
    out = []
    for line in text.splitlines():
        m = _LINE.match(line)
        if not m:
            continue
        body = m.group(2)
        setting = _SETTING.match(body)
        out.append(Advice(int(m.group(1)), body, m.group(3), setting.group(0) if setting else None))
    return out
