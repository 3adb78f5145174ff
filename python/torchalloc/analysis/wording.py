"""The words: every sentence of the report, from the numbers the analysis gives.

Takes a block's reason, category, sites and phases, and the section rows
(phase_summary, estimate, reserve, modules, ooms); gives the sentences:
why a block was freed when it was (`reason_sentence`: Analysis.explain
gives it a block's names, and a lifetime row's every allocating phase),
what a phase kept and threw away (`phase_sentence`), how the estimate
compares with the measured peak (`estimate_sentence`), where the reserve
went and what would have saved it (`reserve_sentences`), which modules
hold the peak (`module_sentences`), and why an OOM happened, who to blame
and what the replays showed (`oom_explanation`). Nothing here computes a
figure; a sentence says what is missing (stacks, phases) when its figures
come from less.
"""
from __future__ import annotations

from typing import Any


from ..units import fmt_bytes, fmt_seconds, fmt_times
from .rules.categorize import Category
from .rules.classify import Reason
from .sections.estimate import Estimate
from .modules import OUTSIDE, Modules
from .sections.ooms.diagnosis import OomRow
from .sections.phases import PhaseRow
from .reserve import PinnedSegment, Reserve, ReserveMoment, ReplayRow
from .rules.sites import NO_PYTHON


def reason_sentence(reason: Reason, category: Category, site: str, free_site: str | None, fn: str | None, phase: str,
                    free_phase: str, rerun: bool, has_stacks: bool) -> str:
    """Why a block was freed when it was, from its reason, category, sites (labels) and phases (names)."""
    if reason is Reason.TEMPORARY:
        return (f"temporary: made and freed on the same line ({site}); invisible to memory measured before and "
                "after that line, but part of its peak")
    if reason is Reason.FUNCTION_RETURNED:
        return (f"freed when its function returned: {fn}() kept it in a local variable until its frame exited, "
                f"back at the caller's line {free_site}")
    if reason is Reason.REBINDING:
        if rerun:
            return (f"freed on rebinding: the same line ({free_site}) ran again and assigned its name a new value, "
                    "freeing this one")
        via = f", after {fn}() returned it" if fn else ""
        return (f"freed on rebinding at {free_site}: it lived until the name holding it was assigned again "
                f"(or deleted) on that line{via}")
    if reason is Reason.SAVED_FOR_BACKWARD:
        return (f"saved for backward: allocated in {phase}, kept alive by autograd for the backward pass "
                f"and freed during it{f' ({free_phase})' if free_phase and free_phase != phase else ''}")
    if reason is Reason.PERSISTENT:
        detail = {
            Category.PARAMETERS: "model parameters or buffers",
            Category.GRADIENTS: f".grad of parameters, allocated in {phase}",
            Category.OPTIMIZER_STATE: f"optimizer state (e.g. Adam's exp_avg and exp_avg_sq), allocated in {phase}",
            Category.WORKSPACE: (f"a library workspace (cuBLAS's, per thread and stream), allocated at the first "
                                 f"matmul in {phase} and never freed"),
        }.get(category, f"allocated in {phase}, still referenced when the log ended")
        if free_phase:  # freed, but only after the run's work ended (rules/classify.py, rule 1: the whole run)
            return (f"persistent: lived through the whole run, freed only after its last phase ended (in "
                    f"{free_phase}) -- {detail.replace(', still referenced when the log ended', '')}")
        return f"persistent: still live at the end of the log -- {detail}"
    no_stacks = " (logged without stacks:1: only phases are known)" if not has_stacks else ""
    if reason is Reason.SAME_PHASE:
        if phase.startswith("the first occurrence of "):  # Analysis.explain's wording for a phase that repeats
            return f"freed within {phase}, which allocated it{no_stacks}"
        return f"freed within the same occurrence of {phase} that allocated it{no_stacks}"
    if reason is Reason.LATER_PHASE:
        return f"outlived {phase}; freed later, in {free_phase}{no_stacks}"
    if category is Category.BEFORE_LOG:
        return "allocated before the log began; freed during it"
    if free_site is None:
        if category in (Category.BACKWARD_TEMPORARIES, Category.GRADIENTS):
            return (f"allocated and freed by autograd's engine during backward ({free_phase or phase}): gradients of "
                    "intermediate results, or recomputation")
        return f"freed on a thread without Python (autograd's engine or a C++ thread), in {free_phase or phase}"
    if site == NO_PYTHON.label:
        return f"allocated on a thread without Python (autograd's engine, in {phase}); freed at {free_site}"
    return f"freed at {free_site}, from a different call path than the one that made it{no_stacks}"


def phase_sentence(row: PhaseRow, params: int) -> str:
    """The phase's row in words, `params` the parameters' bytes (live at the end, else their peak). E.g.
    "optimizer: reserved 6.3 GiB more; 4.2 GiB is optimizer state that stays (2.0 × parameters), 2.1 GiB
    transient"."""
    growth = row.reserved_growth
    if growth > 0:
        head = f"{row.phase}: reserved {fmt_bytes(growth)} more"
    elif growth < 0:
        head = f"{row.phase}: reserved {fmt_bytes(-growth)} less"
    else:
        head = f"{row.phase}: reserved unchanged"
    if row.occurrences > 1:
        head += f" over {row.occurrences} occurrences"
    parts = []
    if row.persistent:
        cats = row.persistent_by_category
        main, main_bytes = next(iter(cats.items())) if cats else ("", 0)
        what = f"{fmt_bytes(row.persistent)} stays ({', '.join(f'{k} {fmt_bytes(v)}' for k, v in cats.items())})"
        if main and main_bytes >= 0.9 * row.persistent:
            what = f"{fmt_bytes(row.persistent)} is {main} that stays"
            if main == str(Category.OPTIMIZER_STATE) and params:
                what += f" ({row.persistent / params:.1f} × parameters)"
        first = row.first_occurrence_persistent
        if row.occurrences > 1 and first and first >= row.persistent * 0.9:
            what += ", all from the first occurrence"
        parts.append(what)
    if row.handed_on:
        to = ", ".join(row.handed_on_to)
        if row.role == "forward" and "backward" in " ".join(row.handed_on_to).lower():
            parts.append(f"{fmt_bytes(row.handed_on)} saved for backward (freed in {to})")
        else:
            parts.append(f"{fmt_bytes(row.handed_on)} outlived it (freed in {to})")
    if row.transient:
        rise = f"; peak {fmt_bytes(row.peak_over_start)} above its start" if row.peak_over_start else ""
        parts.append(f"{fmt_bytes(row.transient)} transient (freed within it{rise})")
    if not parts:
        parts.append("allocated nothing")
    return f"{head}; " + ", ".join(parts) + "."


def estimate_sentence(e: Estimate) -> str:
    """The estimate's formula with the measured terms, and how far the measured peak is from it."""
    P, O, GI, A, est, peak = (e.parameters, e.optimizer_state, e.gradients_plus_intermediates, e.activations,
                              e.estimate, e.measured_peak)
    gap = peak - est
    which = "gradients + optimizer intermediates" if GI >= A else "activations"
    sentence = (
        f"Estimate parameters + optimizer state + max(gradients + optimizer intermediates, activations) = "
        f"{fmt_bytes(P)} + {fmt_bytes(O)} + max({fmt_bytes(GI)}, {fmt_bytes(A)}) = {fmt_bytes(est)} "
        f"(the max is {which}); measured peak allocated {fmt_bytes(peak)}"
    )
    if peak:
        sentence += f", {'above' if gap >= 0 else 'below'} the estimate by {fmt_bytes(abs(gap))}"
        outside = {str(c) for c in (Category.TEMPORARIES, Category.BACKWARD_TEMPORARIES, Category.WORKSPACE,
                                    Category.OTHER_PERSISTENT, Category.OTHER, Category.BEFORE_LOG)}
        extra = {k: v for k, v in e.at_peak.items() if k in outside and v}
        if gap > 0 and extra:
            sentence += "; live at the peak and not in the estimate: " + ", ".join(
                f"{k} {fmt_bytes(v)}" for k, v in sorted(extra.items(), key=lambda kv: -kv[1]))
    return sentence + "."


def oom_explanation(o: OomRow) -> str:
    """The verdict in words, with the numbers behind it, the blocks to blame and what the replays showed."""
    parts = [_oom_verdict_sentence(o)]
    if o.blockers:
        what = "Blocks that pin the most fragmented segments" if o.fragmentation else "The largest live blocks"
        parts.append(what + ": " + "; ".join(_blocker_words(b) for b in o.blockers[:5]) + ".")
    if o.alternatives:
        parts.append(alternatives_sentence(o))
    if o.unknown:
        parts.append("Not known from this log: " + "; ".join(o.unknown) + ".")
    return " ".join(parts)


def _oom_verdict_sentence(o: OomRow) -> str:
    free, requested = o.free_in_reserved, o.requested
    if o.verdict == "fragmentation":
        said = f"fragmentation: {fmt_bytes(free)} of the {fmt_bytes(o.reserved)} torchalloc reserved was free -- "
        if free < requested:
            # The verdict (the C core's rule) can be fragmentation with less cached than asked: the device had
            # room for a new segment by its numbers. "As much as" here contradicted the numbers it stood between.
            return (said + f"less than the {fmt_bytes(requested)} asked for, so it needed a new segment, and the "
                    f"device gave none; the largest free range in the {o.segments} segments was "
                    f"{fmt_bytes(o.largest_free_range)}.")
        return (said + f"{'more than' if free > requested else 'as much as'} the {fmt_bytes(requested)} asked for "
                f"-- but split between live blocks: the largest free range in the {o.segments} segments was "
                f"{fmt_bytes(o.largest_free_range)}, and the device gave no new segment.")
    if o.verdict == "capacity":
        total = f"the device's {fmt_bytes(o.device_total)}" if o.device_total else "what the device could give"
        return (f"capacity: live tensors ({fmt_bytes(o.allocated)}) and the {fmt_bytes(requested)} asked for "
                f"exceed {total}: no allocator could have served it.")
    if o.verdict == "held elsewhere":
        why = []
        if o.held_elsewhere:
            why.append(f"{fmt_bytes(o.held_elsewhere)} of the device was held outside torchalloc (another process, "
                       "another allocator, the CUDA context)")
        if o.limit:
            why.append(f"a memory fraction capped torchalloc at {fmt_bytes(o.limit)}")
        return (f"held elsewhere: {' and '.join(why) or 'the device had no room'}, although live tensors and the "
                f"request ({fmt_bytes(o.allocated + requested)}) fit the device.")
    return f"Verdict: {o.verdict}."


def _blocker_words(b: Any) -> str:
    age = f", {fmt_seconds(b.age_s)} old" if b.age_s >= 0 else ", from before the log"
    return f"{fmt_bytes(b.size)} at {b.site} (phase {b.phase}{age})"


def alternatives_sentence(o: OomRow) -> str:
    """'Replayed up to the failure: phase_arena would have needed 120.0 MiB and fits; caching ...'."""
    assert o.usable is not None
    said = []
    for k, alt in enumerate(o.alternatives):
        verb = "would have needed" if k == 0 else "needed"
        fit = "fits" if alt.fits else "does not fit"
        cost = " (but one device call per request: slow)" if alt.policy == "exact" else ""
        said.append(f"{alt.policy} {verb} {fmt_bytes(alt.needed)} and {fit}{cost}")
    cap = (f"the device has {fmt_bytes(o.usable)}" if not o.limit and not o.held_elsewhere
           else f"torchalloc could use {fmt_bytes(o.usable)}")
    return "Replayed up to the failure: " + "; ".join(said) + f"; {cap}."


def setting_of(policy: str) -> str:
    """The TORCHALLOC_CONF entries that make a replay policy: "caching+compact" -> "policy:caching,expandable:2"."""
    name, _, variant = policy.partition("+")
    extra = {"expandable": ",expandable:1", "compact": ",expandable:2", "reclaim": ",expandable:3"}.get(variant, "")
    return f"policy:{name}{extra}"


def moment_sentence(m: ReserveMoment, when: str) -> str:
    """'At the peak reserved (t=...): 11.53 GiB reserved = 4.64 GiB allocated + ... (fragmentation) + ... (cache).'"""
    terms = [f"{fmt_bytes(m.allocated)} allocated",
             f"{fmt_bytes(m.fragmented)} free in the {m.holding} segments that hold live blocks (fragmentation)",
             f"{fmt_bytes(m.cached)} in {m.empty} wholly free segments (cache)"]
    if m.mapped_free:
        terms.append(f"{fmt_bytes(m.mapped_free)} in mapped but free granules of expandable segments")
    if m.before_log:
        terms.append(f"{fmt_bytes(m.before_log)} free in segments made before the log began (it does not show them)")
    return f"At the {m.at} ({when}): {fmt_bytes(m.reserved)} reserved = " + " + ".join(terms) + "."


def pinned_lines(p: PinnedSegment) -> list[str]:
    """A segment that live blocks pin, and its largest live blocks, one line each."""
    kind = "expandable range" if p.expandable else "segment"
    head = (f"{kind} {p.addr:#x} of {fmt_bytes(p.size)}: {fmt_bytes(p.free)} free, pinned by {p.live_blocks} live "
            f"block{'s' if p.live_blocks != 1 else ''} ({fmt_bytes(p.live_bytes)})")
    lines = [head]
    for b in p.blocks:
        age = f"{fmt_seconds(b.age_s)} old" if b.age_s >= 0 else "from before the log"
        lines.append(f"  {fmt_bytes(b.size):>10}  {b.site}  phase {b.phase}, {b.category}, {age}")
    return lines


def replay_note(r: ReplayRow, base: ReplayRow) -> str:
    """What a replay row is, beside the recording policy's replay."""
    if r.recording:
        return "the policy that recorded the log, replayed"
    if r.oom:
        return "ran out of memory on the simulated device"
    diff = base.peak_reserved - r.peak_reserved
    if r.policy == "exact":
        return ("no cache: every request asks the device (slow on a GPU)" if diff >= 0
                else "no cache: every request asks the device")
    return f"saves {fmt_bytes(diff)}" if diff > 0 else f"reserves {fmt_bytes(-diff)} more" if diff < 0 else "the same"


def reserve_sentences(r: Reserve, log_peak_reserved: int) -> list[str]:
    """The moments' sums, the best change, and why phase_arena loses when it does."""
    out = [moment_sentence(m, when) for m, when in zip(r.moments, fmt_times([m.t_s for m in r.moments]))]
    if r.unknown:
        out.append("Not known from this log: " + "; ".join(r.unknown) + ".")
    if not r.replays:
        return out
    base = r.replays[0]
    match = ("the same as the log's" if base.peak_reserved == log_peak_reserved
             else f"the log's own peak is {fmt_bytes(log_peak_reserved)}")
    out.append(f"Replayed on the simulated device (no memory limit), {base.policy}, the policy that recorded the log, "
               f"reserves {fmt_bytes(base.peak_reserved)} at its peak ({match}).")
    best = r.best
    if best is None:
        out.append(f"No other policy or variant would have reserved less than {base.policy} on these events.")
    else:
        saved = base.peak_reserved - best.peak_reserved
        sentence = (f"The one change that would have saved the most: TORCHALLOC_CONF={setting_of(best.policy)} "
                    f"({best.policy}) reserves {fmt_bytes(best.peak_reserved)}, {fmt_bytes(saved)} less")
        if best.policy == "exact":
            c = r.best_cached()
            sentence += ", but with no cache every request asks the device (slow on a GPU)"
            if c is not None:
                sentence += (f"; of the policies that keep a cache, TORCHALLOC_CONF={setting_of(c.policy)} saves "
                             f"{fmt_bytes(base.peak_reserved - c.peak_reserved)} (reserves "
                             f"{fmt_bytes(c.peak_reserved)})")
        out.append(sentence + ".")
    arena = next((x for x in r.replays if x.policy == "phase_arena"), None)
    caching = next((x for x in r.replays if x.policy == "caching"), None)
    if arena is not None and caching is not None and arena.peak_reserved > caching.peak_reserved * 1.1:
        out.append(f"phase_arena loses here: {fmt_bytes(arena.peak_reserved)} reserved, "
                   f"{arena.peak_reserved / max(1, caching.peak_reserved):.2f}x caching's "
                   f"{fmt_bytes(caching.peak_reserved)}. Each phase has its own arena and an arena does not lend its "
                   "free segments to another phase, so every phase reserves for its own peak and the reserves add "
                   "up. It pays only when long-lived blocks of one phase (optimizer state, say) would otherwise "
                   "pin segments whose free ranges other phases' transients then cannot use; when each phase's "
                   "transients are large and come and go (as here), one shared cache (caching) reserves less.")
    return out


def what_words(what: dict[str, int]) -> str:
    """"8.0 MiB activations saved for backward, 4.0 MiB parameters" (largest first)."""
    return ", ".join(f"{fmt_bytes(n)} {w}" for w, n in what.items()) or "nothing at the peak"


def module_sentences(m: Modules, allocated_at_peak: int) -> list[str]:
    """What the largest modules hold at the peak, and what the attribution could not place."""
    rows = [r for r in m.rows if r.at_peak and r.module != OUTSIDE]
    out = []
    if rows:
        top = rows[0]
        share = f" ({100 * top.at_peak / allocated_at_peak:.0f}% of the {fmt_bytes(allocated_at_peak)} allocated)" \
            if allocated_at_peak else ""
        out.append(f"At the peak, {top.module} holds the most: {fmt_bytes(top.at_peak)}{share}: "
                   f"{what_words(top.what_at_peak)}.")
    outside = next((r for r in m.rows if r.module == OUTSIDE and r.at_peak), None)
    if outside:
        out.append(f"{fmt_bytes(outside.at_peak)} at the peak was allocated outside every tracked module's forward "
                   "and backward (inputs, the loss, blocks from before track()) and is no module's parameter, "
                   f"gradient or optimizer state: {what_words(outside.what_at_peak)}.")
    if m.tags_unmatched:
        out.append(f"{m.tags_unmatched} parameter, gradient or optimizer-state addresses named no live block "
                   "(a tensor off this device, or a log opened after track()): those blocks count where they "
                   "were allocated.")
    return out
