"""A plan: the model's predictions at the asked multiple under every policy, the largest multiple that fits, what
the prediction rests on, and its limits, as data (`Plan`, `to_dict`) for the text, the JSON and the report.

    plan = make_plan(model, 2.0, capacity=80 << 30)

What the prediction assumes, said in its limits (`limits`), each with what
this log shows of it: that each step at k x B is each recorded step with
its sizes by their laws (drawn shapes and data-dependent sizes repeat as
recorded; the steps' spread says how much they varied); that the libraries
pick the same algorithms (workspaces kept, or grown as temporaries); that
the log holds whole steps (a log cut inside a step is said); and which
bytes it could not attribute, with the peak they would make if they grew
too.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from ..analysis import NO_PYTHON, Category
from ..replay.engine import DEFAULT_POLICIES, INSTALL_DEFAULT, setting_of
from ..units import fmt_bytes
from .laws import FIXED, SCALING, UNATTRIBUTED, law_name
from .model import Model, knob_fact
from .predict import DEFAULT_STEP, PolicyPlan, Progress, best, plan_policies
from .steps import Steps

FLAT_STEPS = 0.02  # steps whose peaks are within this share of one another look alike
NATIVE = "caching"  # the policy that is PyTorch's caching allocator byte for byte (ordinary segments)
LAWS_SHOWN = 1000  # the JSON's laws, the most bytes first


@dataclasses.dataclass
class Limit:
    """One limit of the prediction: what it assumes, and what this log shows of it."""

    key: str  # "steps", "cut", "algorithms", "unattributed", "order"
    text: str


@dataclasses.dataclass
class Plan:
    """What `torchalloc plan` prints (module docstring)."""

    paths: list[str]
    device: int
    multiple: float  # the knob's multiple of the (first) run's
    recorded: float | None  # the (first) run's batch (or knob value) when given
    capacity: int | None
    capacity_from: str  # "--capacity", "the recording GPU's (from the log)", ...
    model_fact: str
    recorded_allocated: int
    recorded_reserved: int | None  # None: the log has no segment records
    recorded_by: str  # "recorded (caching)": the policy that served the run; "recorded" without segments
    by_kind: dict[str, int]  # "grow", "kept", "not attributed" -> bytes live at the recorded peak
    policies: list[PolicyPlan]
    steps: Steps
    limits: list[Limit]
    laws: list[tuple[str, str, int, int]]  # two runs: (site @ phase, law, allocations, bytes at 1x), largest first
    step: float  # the largest multiple's grid

    @property
    def default(self) -> PolicyPlan | None:
        return next((p for p in self.policies if p.is_default), None)

    @property
    def searched(self) -> bool:
        """Whether the largest multiple was searched for any policy (not under --no-search)."""
        return any(p.searched for p in self.policies)

    @property
    def best(self) -> PolicyPlan | None:
        return best(self.policies)

    def batch_of(self, x: float | None) -> int | None:
        """The batch (knob value) at multiple x, when the recorded one is known."""
        return None if x is None or self.recorded is None else int(round(x * self.recorded))


def fmt_multiple(x: float) -> str:
    return f"{round(x, 2):g}x"


def recording_capacity(model: Model) -> tuple[int | None, str]:
    """The recording GPU's memory when the log says it (its device record, in logs of version 3; else an
    out-of-memory record, which carries the device's total and the memory fraction's limit), and where it came
    from."""
    def said(total: int, limit: int | None, where: str) -> tuple[int, str]:
        if limit and limit < total:
            return limit, f"the recording GPU's memory fraction ({where})"
        return total, f"the recording GPU's ({where})"

    told = model.run.analysis.scan.device_memory
    if told:
        return said(*told, "from the log")
    for row in reversed(model.run.analysis.ooms(check_alternatives=False)):
        if row.device_total:
            return said(row.device_total, row.limit, "from its OOM record")
    return None, ""


def make_plan(model: Model, multiple: float, capacity: int | None, *, capacity_from: str = "--capacity",
              recorded: float | None = None, policies: Sequence[str] = DEFAULT_POLICIES, search: bool = True,
              progress: Progress | None = None, threads: int | None = None, brief: bool = False,
              ceiling: int | None = None) -> Plan:
    """The plan at `multiple` (module docstring); `recorded`: the run's batch, so the search steps whole batches.
    `brief`: what the report's line needs, in as few replays as it can be had (predict.plan_policies: the
    search goes down from `ceiling`, counted when not given): the peaks, the fit and the largest multiple, with
    no upper bound and so no limits."""
    run = model.run
    a = run.analysis
    step = 1.0 / recorded if recorded else DEFAULT_STEP
    plans = plan_policies(model, multiple, capacity, policies=policies, step=step, search=search,
                          progress=progress, threads=threads, brief=brief, ceiling=ceiling)
    by_category = a.anatomy("peak").by_category if len(a.table) else {}
    by_kind = {"grow": sum(by_category.get(str(c), 0) for c in SCALING),
               "kept": sum(by_category.get(str(c), 0) for c in FIXED),
               "not attributed": sum(by_category.get(str(c), 0) for c in UNATTRIBUTED)}
    steps = run.steps
    segments = run.trace.native_peak_reserved is not None  # the log recorded its segments: what was reserved
    plan = Plan([run.path] + ([model.other.path] if model.other is not None else []), a.device, multiple, recorded,
                capacity, capacity_from if capacity else "", knob_fact(model), a.timeline.peak_allocated,
                a.timeline.peak_reserved if segments else None, run.trace.native_label if segments else "recorded",
                by_kind, plans, steps, [], _laws(model), step)
    if not brief:
        plan.limits = limits(plan, model, by_category)
    return plan


def _laws(model: Model) -> list[tuple[str, str, int, int]]:
    """Two runs: each site's law (site @ phase, law, allocations, their bytes at 1x), the most bytes first; the
    laws of a site's allocations differ when its shapes do: each law its own row."""
    if model.runs == 1:
        return []
    keys, texts = model.run.keys()
    pre = model.run.before_log
    rho, size = model.rho[pre:], model.run.size[pre:]
    known = ~model.unattributed[pre:]
    rows: dict[tuple[str, str], list[int]] = {}
    for key, ratio, nbytes in zip(keys[known].tolist(), rho[known].tolist(), size[known].tolist()):
        row = rows.setdefault((texts[key], law_name(ratio, model.r)), [0, 0])
        row[0] += 1
        row[1] += nbytes
    return sorted(((k, law, n, b) for (k, law), (n, b) in rows.items()), key=lambda r: (-r[3], r[0], r[1]))


def limits(plan: Plan, model: Model, by_category: dict[str, int]) -> list[Limit]:
    """The prediction's limits, each with what this log shows (module docstring)."""
    x = fmt_multiple(plan.multiple)
    out = [Limit("order", f"The prediction replays every event of the recorded run at {x}, in the same order, "
                          "with the same lifetimes: only sizes change, each by its law.")]
    out.append(Limit("steps", _steps_words(plan.steps)))
    if plan.steps.cut:
        out.append(Limit("cut", f"The log may end inside a step ({plan.steps.cut}): that step is replayed as far as "
                                "it ran; the prediction assumes the complete steps before it hold the peak."))
    out.append(Limit("algorithms", _algorithms_words(plan, model, by_category, x)))
    out.append(Limit("unattributed", _unattributed_words(plan, model, x)))
    return out


def _steps_words(s: Steps) -> str:
    if not s.marked:
        return ("Steps: the log marks none (no repeated marker, no phase named forward, backward or optimizer): the "
                "prediction assumes it holds whole steps; whether sizes vary from step to step it cannot tell.")
    spread = s.spread()
    head = f"Steps: {s.complete} complete (from {s.by})"
    if spread is None:
        return (f"{head}: one step cannot show whether shapes are drawn per step or sizes set by the data; later "
                "steps can differ (caches fill, the optimizer's state appears at its first step).")
    lo, hi, share = spread
    if share <= FLAT_STEPS:
        return (f"{head}, peaking within {share:.1%} of one another: no shape drawn per step and no size set by the "
                "data, as far as these steps show.")
    return (f"{head}, peaking between {fmt_bytes(lo)} and {fmt_bytes(hi)} allocated ({share:.0%} apart): the "
            "steps differ (shapes drawn per step, sizes set by the data such as detections or tokens, steps run "
            "another way), and the prediction repeats each as recorded, so a run that draws a step larger than "
            "any recorded peaks higher, by what these steps cannot show: on Mask R-CNN with drawn image sizes "
            "(H200, 2026-11-28) a log of 6 steps at batch 2 put batch 4 and 8 within 1.5% under the default, a "
            "log of the same program under another seed, whose steps drew smaller images, 27-28% low. Record "
            "more steps, or one at the largest shape the data holds. The reserve of ordinary segments (caching: "
            "PyTorch's allocator) follows which sizes come in which order, and the scaled run keeps the recorded "
            "order: on that first log PyTorch's reserve was predicted 8% high at 2x and 19% at 4x.")


def _algorithms_words(plan: Plan, model: Model, by_category: dict[str, int], x: str) -> str:
    workspace = by_category.get(str(Category.WORKSPACE), 0)
    text = (f"Algorithms: assumed the same at {x} as recorded (cuDNN and cuBLAS pick theirs, and their workspaces, "
            f"by shape); {fmt_bytes(workspace)} of library workspaces at the recorded peak kept at their size")
    a = model.run.analysis
    if not a.has_stacks:
        return text + ("; the log has no stacks, so a workspace is told from a temporary by its size alone: one "
                       "taken for a temporary grows with the batch, and a workspace picked anew is off by its size.")
    outside = sum(r.bytes for r in a.anatomy("peak").rows
                  if r.site == NO_PYTHON.label and r.category in {str(c) for c in SCALING})
    return text + (f"; {fmt_bytes(outside)} of temporaries made outside Python (autograd's engine, the libraries) "
                   "grow with the batch: a workspace among them that does not, or one picked anew, is off by its "
                   "size.")


def _unattributed_words(plan: Plan, model: Model, x: str) -> str:
    d = plan.default or (plan.policies[0] if plan.policies else None)
    if d is None:
        return ""
    extra = d.high_peak_reserved - d.peak_reserved
    share = f", +{extra / d.peak_reserved:.1%}" if d.peak_reserved and extra else ""
    bound = (f"grown with the batch instead, {d.policy}'s peak reserved at {x} would be "
             f"{fmt_bytes(d.high_peak_reserved)} ({'+' if extra >= 0 else ''}{fmt_bytes(extra)}{share})")
    if model.runs == 2:
        pre = model.run.before_log
        loose = model.unattributed[pre:]
        n, nbytes = int(loose.sum()), int(model.run.size[pre:][loose].sum())
        text = (f"Laws measured for {len(loose) - n} of {len(loose)} allocations ({model.matched}; "
                f"{model.by_site_mean} of them by their site's mean size, the two runs making different numbers "
                f"there)")
        if n or pre:
            off = (f", {model.off_law} of them because their sizes shrank or grew faster than the knob's square "
                   "between the logs (a choice made anew, such as a cuDNN algorithm and its workspace)"
                   if model.off_law else "")
            return text + (f"; {n} found no match in the second log or no law in it ({fmt_bytes(nbytes)} requested "
                           f"in all{off})" + (f" and {pre} were allocated before the log" if pre else "")
                           + f", given their category's law; {bound}.")
        return text + "."
    unknown = plan.by_kind["not attributed"]
    said = (f"Attributed at the recorded peak: {fmt_bytes(plan.by_kind['grow'])} grow with the batch (activations, "
            f"temporaries; a copy the forward makes of a weight, as autocast's bf16 casts, lives like an activation "
            f"and is grown too, over by its size: two logs measure it), {fmt_bytes(plan.by_kind['kept'])} do not "
            "(parameters, gradients, optimizer state, workspaces)")
    if not unknown and not model.unattributed.any():
        return said + "; nothing left unattributed."
    return said + (f"; {fmt_bytes(unknown)} not attributed ({', '.join(str(c) for c in UNATTRIBUTED)}), kept at their "
                   f"size; {bound}.")


def to_dict(plan: Plan) -> dict[str, Any]:
    """The --json document: bytes as integers, multiples as floats."""
    chosen = plan.best
    return {
        "logs": plan.paths,
        "device": plan.device,
        "multiple": plan.multiple,
        "batch": plan.batch_of(plan.multiple),
        "recorded_batch": plan.recorded,
        "capacity": plan.capacity,
        "capacity_from": plan.capacity_from or None,
        "model": plan.model_fact,
        "recorded": {"peak_allocated": plan.recorded_allocated, "peak_reserved": plan.recorded_reserved,
                     "by": plan.recorded_by},
        "at_recorded_peak": plan.by_kind,
        "policies": {p.policy: {
            "peak_allocated": p.peak_allocated, "peak_reserved": p.peak_reserved, "fits": p.fits,
            "largest_multiple": p.largest, "largest_batch": plan.batch_of(p.largest), "at_least": p.at_least,
            "largest_searched": p.searched,
            "default": p.is_default, "pytorch": p.policy == NATIVE, "too_large": p.too_large,
            "if_unattributed_grow": {"peak_allocated": p.high_peak_allocated, "peak_reserved": p.high_peak_reserved},
        } for p in plan.policies},
        "best": None if chosen is None else {"policy": chosen.policy, "setting": setting_of(chosen.policy),
                                             "largest_multiple": chosen.largest, "at_least": chosen.at_least,
                                             "largest_batch": plan.batch_of(chosen.largest)},
        "steps": {"by": plan.steps.by or None, "complete": plan.steps.complete, "cut": plan.steps.cut or None,
                  "peaks": plan.steps.peaks},
        "laws": [{"site": s, "law": law, "allocations": n, "bytes": b} for s, law, n, b in plan.laws[:LAWS_SHOWN]],
        "laws_left_out": max(0, len(plan.laws) - LAWS_SHOWN),
        "limits": {x.key: x.text for x in plan.limits},
        "search_step": plan.step,
        "default_policy": INSTALL_DEFAULT,
    }
