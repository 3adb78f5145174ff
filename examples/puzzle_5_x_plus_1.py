#!/usr/bin/env python3
"""Puzzle 5: `x = x + 1` versus `x + 1`, inside and outside a function.

- `x + 1` whose result is dropped: temporary -- made and freed on the same
  line, invisible to memory measured before and after it, but part of its peak;
- `x = x + 1` inside a function: the new x lives in a local variable until
  the function returns -- freed at the caller's line that called it;
- `x = x + 1` at top level: the old x is freed right there, on rebinding,
  and the new one lives until the name is assigned again.

    python3 examples/puzzle_5_x_plus_1.py
"""
from puzzle_common import explain_line, finish, here, print_phases, reasons_at, result, start

torch, LOG = start("puzzle5")
import torchalloc  # noqa: E402

N = 6 << 20  # 6 Mi floats: 24 MiB per tensor, easy to see


def add_one_locally(x):
    global LOCAL_LINE
    LOCAL_LINE = here() + 1
    x = x + 1
    return None


with torchalloc.phase("puzzle"):
    FIRST_LINE = here() + 1
    x = torch.ones(N, device="cuda")
    TEMP_LINE = here() + 1
    x + 1
    CALL_LINE = here() + 1
    add_one_locally(x)
    REBIND_LINE = here() + 1
    x = x + 1
    y = x * 2
    LAST_LINE = here() + 1
    x = x * 3
torchalloc.mark("end")

a = finish(LOG)
explain_line(a, __file__, TEMP_LINE, "x + 1 (result dropped)")
explain_line(a, __file__, LOCAL_LINE, "x = x + 1 inside add_one_locally(x)")
explain_line(a, __file__, FIRST_LINE, "x = torch.ones(...), later rebound by x = x + 1 at top level")
explain_line(a, __file__, REBIND_LINE, "x = x + 1 at top level, later rebound by x = x * 3")
print_phases(a)
free_site_local = [r.free_site for r in a.lifetimes() if r.site.startswith(f"puzzle_5_x_plus_1.py:{LOCAL_LINE} ")]
free_site_first = [r.free_site for r in a.lifetimes() if r.site.startswith(f"puzzle_5_x_plus_1.py:{FIRST_LINE} ")]
result(temp=reasons_at(a, __file__, TEMP_LINE), local=reasons_at(a, __file__, LOCAL_LINE),
       first=reasons_at(a, __file__, FIRST_LINE), rebind=reasons_at(a, __file__, REBIND_LINE),
       local_free_site=free_site_local, first_free_site=free_site_first,
       lines={"temp": TEMP_LINE, "local": LOCAL_LINE, "call": CALL_LINE, "first": FIRST_LINE, "rebind": REBIND_LINE,
              "last": LAST_LINE})
