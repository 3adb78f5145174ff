"""The last out-of-memory failure, as torchalloc saw it: torchalloc.last_oom().

    try:
        train_step()
    except torch.OutOfMemoryError:
        oom = torchalloc.last_oom()
        print(oom.verdict, oom.summary)   # "fragmentation", "CUDA out of memory. Tried to ..."
        print(oom.report)                 # the full report: segment map, blocks that pin them, sites, ages

The numbers, the verdict and both texts come from the C core, which built
them at the failure while the heap still looked as it did (the report is
also in the file `oom.path` names). With a log open, `torchalloc report LOG`
adds the check by replay: how much each policy would have needed for the run
up to the failure, and whether it fits.

Runtime module: no numpy, no tools.
"""
from __future__ import annotations

import dataclasses

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
    summary: str  # one paragraph, as the OutOfMemoryError message says it
    report: str  # the full text
    path: str  # where the report was written ("" when nowhere)

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
                     path=_lib.oom_report_path(index), **facts)
