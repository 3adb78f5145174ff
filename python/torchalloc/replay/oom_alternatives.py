"""Would another policy have fit? The run up to an OOM, replayed under each policy.

Takes the trace of the run up to an OOM (analysis/sections/ooms/diagnosis.py builds it
from the log: every allocation, free and phase before the failure, blocks
allocated before the log was opened reconstructed at the start, and the
failed request last, at an address no block uses: `_unused_address`) and
the capacity torchalloc could use then, and replays it through each
policy on the simulated device (engine.py, the very C code that serves the
GPU):

- `needed`: the smallest capacity at which the whole run, the failed
  request included, completes (bisection, as `torchalloc replay` finds it);
- `fits`: whether it completes at the capacity the failing run had.

The policies are every policy and variant `torchalloc replay` knows
(engine.DEFAULT_POLICIES: caching+reclaim is expandable:reclaim). This is the
check behind the OOM's advice (`check_advice`): each line the allocator's
rule gives (allocator/accounting/oom_advice.c) is matched with the replay
that tests it -- a setting with the policy or variant it makes, "shrink
live tensors" with whether anything fits, "raise the memory fraction" or
"free what others hold" with a replay at the capacity that would give --
and marked confirmed, or said not to have helped: "confirmed by replay:
caching+reclaim fits in 150.00 MiB, peak reserved 128.00 MiB".
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Sequence

import numpy as np

from .. import _records as records
from ..oom import Advice
from ..units import fmt_bytes
from .engine import DEFAULT_POLICIES, min_capacity, replay_once
from ..log.trace_events import ALLOC, FREE, PHASE_BEGIN, PHASE_END, Trace, live_peaks

_TO_EVENT = np.zeros(256, dtype=np.uint8)
_TO_EVENT[[records.ALLOC, records.FREE, records.PHASE_BEGIN, records.PHASE_END]] = [ALLOC, FREE, PHASE_BEGIN,
                                                                                  PHASE_END]


@dataclasses.dataclass
class Alternative:
    policy: str
    needed: int  # bytes: the smallest capacity that runs it all
    fits: bool  # within the capacity the failing run had
    peak_reserved: int  # with no limit at all
    peak_reserved_at_capacity: int = 0  # under the capacity the failing run had (up to its OOM when it does not fit)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _unused_address(used: np.ndarray) -> int:
    """An address no event uses, at least 1 MiB from every used one: past the highest, else (a log with an
    address at the top of the 64-bit space) below the lowest, else in the first wide enough gap."""
    gap = 1 << 20
    top = int(used.max(initial=0))
    if top < (1 << 64) - 2 * gap:
        return top + gap
    if int(used.min()) >= 2 * gap:
        return int(used.min()) - gap
    u = np.unique(used)
    wide = np.flatnonzero(np.diff(u) >= 2 * gap)
    return int(u[wide[0]]) + gap  # fewer than 2^43 addresses cannot leave every gap narrower


def alternatives(events: Any, capacity: int, policies: Sequence[str]) -> list[Alternative]:
    """Each policy's need for `events` (an event array, or a Trace whose events come in pieces) and whether it
    fits `capacity`, smallest need first."""
    floor = events.peak_rounded if isinstance(events, Trace) else live_peaks(events)[1]
    out = []
    for policy in policies:
        free_run, _ = replay_once(events, policy, 0)
        peak = int(free_run["peak_reserved"])
        at_capacity, _ = replay_once(events, policy, capacity)
        needed = min_capacity(events, policy, floor, peak)
        out.append(Alternative(policy, needed, not at_capacity["oom"], peak, int(at_capacity["peak_reserved"])))
    return sorted(out, key=lambda a: (a.needed, a.policy))


def default_policies() -> list[str]:
    """Every policy, then the variants with expandable segments (engine.DEFAULT_POLICIES)."""
    return list(DEFAULT_POLICIES)


# ---------------------------------------------------------------------------
# The advice, checked
# ---------------------------------------------------------------------------

# The TORCHALLOC_CONF settings for expandable segments, by name and by number, as the suffix of the replay
# variant that runs a policy with them; the advice names expandable:reclaim (TA_ADVICE_EXPANDABLE in
# allocator/accounting/oom_advice.h), a failing run's mode is known by number.
SETTING_VARIANTS = {"expandable:1": "+expandable", "expandable:on": "+expandable", "expandable:2": "+compact",
                    "expandable:compact": "+compact", "expandable:3": "+reclaim", "expandable:reclaim": "+reclaim"}
NOT_A_SETTING = "not checked by replay: it asks for a change to the program, not a setting"


@dataclasses.dataclass
class AdviceCheck:
    """One advice line and what the replay of the run up to the failure says of it."""

    number: int
    text: str  # the line, "[based on ...]" included
    setting: str | None  # the TORCHALLOC_CONF entry it names, None when it asks for something else
    serves: bool | None  # what the line's own figures say (None: it does not say)
    replayed: str | None  # the policy or variant replayed for it, None when no replay checks it
    confirmed: bool | None  # True: the replay agrees; False: it would not have helped; None: not checked
    check: str  # the sentence: "confirmed by replay: caching+reclaim fits in ..., peak reserved ..."

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def variant_for(setting: str | None, policy: str, expandable: int) -> str | None:
    """The replay policy a setting makes of a run under `policy` with expandable:`expandable` (None: none)."""
    if not setting:
        return None
    key, _, value = setting.partition(":")
    if setting in SETTING_VARIANTS:
        return policy + SETTING_VARIANTS[setting] if policy != "exact" else None
    if key == "policy" and value in records.POLICY_NAMES.values():
        suffix = SETTING_VARIANTS.get(f"expandable:{expandable}", "") if expandable and value != "exact" else ""
        return value + suffix
    return None


def check_advice(lines: Sequence[Advice], alts: Sequence[Alternative], events: Any, *, policy: str,
                 expandable: int, capacity: int, device_total: int, limit: int) -> list[AdviceCheck]:
    """Each advice line of an OOM, matched with the replay that tests it (see the module's docstring).

    `alts` are `alternatives(events, capacity, ...)`; `policy` and `expandable` what the failing run
    used; the device's total and the memory fraction's cap (0: none) give the capacities of the lines
    about the fraction and about other processes."""
    by_policy = {a.policy: a for a in alts}
    failing = variant_for(f"policy:{policy}", policy, expandable) or policy
    cap = fmt_bytes(capacity)
    out = []
    for line in lines:
        variant = variant_for(line.setting, policy, expandable)
        replayed: str | None = None
        confirmed: bool | None = None
        if variant is not None:
            alt = by_policy.get(variant) or alternatives(events, capacity, [variant])[0]
            replayed, confirmed = variant, alt.fits
            check = (f"confirmed by replay: {variant} fits in {cap}, peak reserved "
                     f"{fmt_bytes(alt.peak_reserved_at_capacity)}" if alt.fits else
                     f"would not have helped, by replay: {variant} runs out of memory in {cap} too (it needs "
                     f"{fmt_bytes(alt.needed)})")
        elif line.text.startswith("shrink live tensors"):
            fitting = [a for a in alts if a.fits]
            least = min(alts, key=lambda a: a.needed) if alts else None
            confirmed = not fitting
            if least is None:
                confirmed, check = None, "not checked: nothing was replayed"
            elif confirmed:
                check = (f"confirmed by replay: no policy or variant fits in {cap}; the least any needs is "
                         f"{fmt_bytes(least.needed)} ({least.policy})")
            else:
                check = (f"not needed, by replay: {fitting[0].policy} fits in {cap} (peak reserved "
                         f"{fmt_bytes(fitting[0].peak_reserved_at_capacity)})")
        elif line.text.startswith(("raise the memory fraction", "free what other processes")) and device_total:
            target = _capacity_for(line, device_total, capacity, limit)
            result, _ = replay_once(events, failing, target)
            replayed, confirmed = failing, not result["oom"]
            check = (f"confirmed by replay: {failing} fits in {fmt_bytes(target)}, peak reserved "
                     f"{fmt_bytes(int(result['peak_reserved']))}" if confirmed else
                     f"would not have helped, by replay: {failing} runs out of memory in {fmt_bytes(target)} too")
        else:
            check = NOT_A_SETTING
        out.append(AdviceCheck(line.number, line.text, line.setting, line.serves, replayed, confirmed, check))
    return out


_FRACTION = re.compile(r"at least (\d+\.\d+)")


def _capacity_for(line: Advice, device_total: int, capacity: int, limit: int) -> int:
    """What torchalloc could use had the line been followed: the fraction it names of the device, or the
    device with nothing held by others (still under the fraction's cap)."""
    m = _FRACTION.search(line.text)
    if line.text.startswith("raise the memory fraction") and m:
        return max(capacity, int(float(m.group(1)) * device_total))
    return max(capacity, min(limit or device_total, device_total))
