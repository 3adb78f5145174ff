#!/usr/bin/env python3
"""Puzzle 7: an out-of-memory error while plenty of reserved memory is free.

6 MiB tensors fill 20 MiB segments three at a time; freeing the first and
last of each three leaves 2/3 of the reserved memory free but in holes of
6 and 8 MiB, pinned by the middle tensor. With the device limited (memory
fraction) just above what is reserved, a 12 MiB tensor fits in no hole and
no new segment fits either: OOM. The report explains it from the log: the
free bytes in reserved segments, and their largest contiguous range.

    python3 examples/puzzle_7_fragmentation_oom.py
"""
from puzzle_common import finish, here, print_phases, result, start

torch, LOG = start("puzzle7")
import torchalloc  # noqa: E402
import torchalloc._lib  # noqa: E402

MiB = 1 << 20
with torchalloc.phase("fill"):
    blocks = [torch.empty(6 * MiB, dtype=torch.uint8, device="cuda") for _ in range(36)]
reserved = torchalloc.memory_reserved()
total = torch.cuda.mem_get_info()[1]  # cudaMemGetInfo's total, the one torchalloc's limit multiplies
# the device "ends" 4 MiB above what is reserved now: no room for another 12 MiB segment
fraction = min(1.0, (reserved + 4 * MiB) / total)
torch.cuda.set_per_process_memory_fraction(fraction)  # torch forwards it to torchalloc's hook
torchalloc._lib.lib().torchalloc_set_memory_fraction(fraction, 0)  # and directly, in case this torch does not
with torchalloc.phase("free every other"):
    for i in range(0, len(blocks), 3):
        blocks[i] = blocks[i + 2] = None
torchalloc.mark("fragmented")
error = None
with torchalloc.phase("big allocation"):
    try:
        OOM_LINE = here() + 1
        big = torch.empty(12 * MiB, dtype=torch.uint8, device="cuda")
        if big.data_ptr() == 0:
            error = "the allocator returned NULL (PyTorch raised nothing)"
        del big
    except (RuntimeError, MemoryError) as e:  # torch.OutOfMemoryError is a RuntimeError
        error = f"{type(e).__name__}: {str(e).splitlines()[0]}"
print(f"12 MiB allocation: {error or 'succeeded (no OOM: the memory fraction hook did not apply?)'}")

a = finish(LOG)
for o in a.ooms():
    print(f"\nOOM at {o.site} in {o.phase}: asked {o.requested / MiB:.0f} MiB, {o.allocated / MiB:.0f} MiB allocated, "
          f"{o.reserved / MiB:.0f} MiB reserved, {o.free_in_reserved / MiB:.0f} MiB of it free, "
          f"largest free range {o.largest_free_range / MiB:.0f} MiB")
    print(f"  {o.explanation}")
print_phases(a)
result(error=error, ooms=[o.to_dict() for o in a.ooms()], oom_line=OOM_LINE)
