"""Variants: which allocator a run uses, written as NAME[+MODIFIER...].

    native                 PyTorch's caching allocator, PYTORCH_CUDA_ALLOC_CONF unset
    native+expandable      PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    native+async           PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
    native+history         native, with torch.cuda.memory._record_memory_history(stacks="python")
                           on from before the warm-up (PyTorch's own allocation log with stacks)
    torchalloc             torchalloc.install() and nothing set: what a user gets (caching, expandable:reclaim
                           where the driver has virtual memory management)
    POLICY                 torchalloc through the C++ bridge (torchalloc.install), TORCHALLOC_CONF=policy:POLICY,
                           expandable:off (ordinary segments: for caching, PyTorch's allocator byte for byte)
    POLICY+expandable      ... expandable:on
    POLICY+compact         ... expandable:compact (compacted before reserving past the high-water mark, after a
                           device synchronize)
    POLICY+reclaim         ... expandable:reclaim (the default: compacted without synchronizing)
    ...+log                ... + log:<temporary file> (the block log, no stacks)
    ...+stacks             ... + log:<temporary file>,stacks:1 (the block log with Python stacks)
    ...+runs               ... + run:64MiB (warm-up growth mapped in handles of 64 MiB; 32 MiB by default)
    ...+runs32             ... + run:32MiB (the default's runs, said explicitly)
    ...+noruns             ... + run:0 (every handle one granule: the default before runs of 32 MiB)
    ...+grow               ... + grow_below:1GiB (below 1 GiB reserved, new memory where it would move memory;
                           never by default)

--extra-conf is appended to every torchalloc variant's TORCHALLOC_CONF.
This is bench/step_time.py's grammar, with `+history` and `+expandable`
added; every torchalloc variant here takes the bridge route, the one users get.
"""
from __future__ import annotations

from dataclasses import dataclass

POLICIES = ("caching", "exact", "phase_arena")
DEFAULT = "torchalloc"  # install() with nothing set
SEGMENT_MODES = {"expandable": "on", "compact": "compact", "reclaim": "reclaim"}  # modifier -> expandable:
NATIVE_MODIFIERS = {
    "expandable": "expandable_segments:True",
    "async": "backend:cudaMallocAsync",
    "history": "",  # no allocator setting: the child turns PyTorch's memory history on
}
RUNS_CONFS = {"runs": "run:64MiB", "runs32": "run:32MiB", "noruns": "run:0"}  # +runs, +runs32, +noruns
GROW_CONF = "grow_below:1GiB"  # +grow
TORCHALLOC_MODIFIERS = (*SEGMENT_MODES, "log", "stacks", *RUNS_CONFS, "grow")
LOG_NAME = "ta_%p.talog"  # in the run's log directory; %p: the child's pid

# What a default run compares (ordered: native first, since ratios are to it): PyTorch's three allocators,
# torchalloc's default, expandable segments without compaction, and caching's PyTorch parity.
DEFAULT_VARIANTS = ("native", "native+expandable", "native+async", DEFAULT, "caching+expandable", "caching")
# `exact` makes one device allocation per request: slow on big models, so by default only on these.
EXACT_WORKLOADS = ("convnet", "encoder")
# --stacks: deliverable 4's comparison on GPT-2.
STACKS_VARIANTS = ("native", "native+history", "caching", "caching+log", "caching+stacks")


@dataclass(frozen=True)
class Variant:
    name: str
    native: bool
    modifiers: tuple[str, ...]
    policy: str = ""  # torchalloc's policy; "" for native
    default: bool = False  # `torchalloc`: nothing set, install()'s choices

    @property
    def history(self) -> bool:
        return "history" in self.modifiers

    @property
    def logs(self) -> bool:
        return "log" in self.modifiers or "stacks" in self.modifiers

    def native_conf(self) -> str:
        """PYTORCH_CUDA_ALLOC_CONF for a native variant ("" = leave it unset)."""
        return next((NATIVE_MODIFIERS[m] for m in self.modifiers if NATIVE_MODIFIERS[m]), "")

    def torchalloc_conf(self, extra_conf: str, log_dir: str) -> str:
        """TORCHALLOC_CONF for a torchalloc variant ("" for `torchalloc`: the library's defaults)."""
        conf = [] if self.default else [f"policy:{self.policy}"]
        if not self.default:
            mode = next((SEGMENT_MODES[m] for m in self.modifiers if m in SEGMENT_MODES), "off")
            conf.append(f"expandable:{mode}")
        if self.logs:
            conf.append(f"log:{log_dir.rstrip('/')}/{LOG_NAME}")
        if "stacks" in self.modifiers:
            conf.append("stacks:1")
        conf += [RUNS_CONFS[m] for m in self.modifiers if m in RUNS_CONFS]
        if "grow" in self.modifiers:
            conf.append(GROW_CONF)
        if extra_conf.strip(" ,"):
            conf.append(extra_conf.strip(" ,"))
        return ",".join(conf)

    def describe(self, extra_conf: str = "") -> str:
        """The setting in words, for the plan and the tables."""
        if self.native:
            conf = self.native_conf()
            text = f"PYTORCH_CUDA_ALLOC_CONF={conf}" if conf else "PyTorch's caching allocator"
            return text + (", _record_memory_history(stacks='python')" if self.history else "")
        conf = self.torchalloc_conf(extra_conf, "LOGDIR")
        if self.default:
            return "torchalloc.install(), " + (f"TORCHALLOC_CONF={conf}" if conf else "nothing set") + \
                " (caching, expandable:reclaim where the driver has virtual memory management)"
        return "TORCHALLOC_CONF=" + conf


def parse_variant(text: str) -> Variant:
    """`native[+expandable|+async|+history]`, `torchalloc[+log][+stacks][+runs|+runs32|+noruns][+grow]` or
    `POLICY[+expandable|+compact|+reclaim][+log][+stacks]`; ValueError says why not."""
    base, *mods = [part.strip() for part in text.strip().split("+")]
    if len(set(mods)) != len(mods):
        raise ValueError(f"variant {text!r}: a modifier is repeated")
    if len([m for m in mods if m in SEGMENT_MODES]) > 1:
        raise ValueError(f"variant {text!r}: at most one of {', '.join('+' + m for m in SEGMENT_MODES)}")
    if len([m for m in mods if m in RUNS_CONFS]) > 1:
        raise ValueError(f"variant {text!r}: at most one of {', '.join('+' + m for m in RUNS_CONFS)}")
    if base == DEFAULT:
        if any(m in SEGMENT_MODES or m not in TORCHALLOC_MODIFIERS for m in mods):
            takes = ["+" + m for m in TORCHALLOC_MODIFIERS if m not in SEGMENT_MODES]
            raise ValueError(f"variant {text!r}: {DEFAULT} (install()'s defaults) takes only {', '.join(takes[:-1])} "
                             f"and {takes[-1]}")
        return Variant(text.strip(), False, tuple(mods), policy=POLICIES[0], default=True)
    if base == "native":
        unknown = [m for m in mods if m not in NATIVE_MODIFIERS]
        if unknown or len(mods) > 1:
            raise ValueError(f"variant {text!r}: native takes at most one of "
                             f"{', '.join('+' + m for m in NATIVE_MODIFIERS)}")
        return Variant(text.strip(), True, tuple(mods))
    if base not in POLICIES:
        raise ValueError(f"unknown variant {text!r}: the name is native, {DEFAULT} or a policy "
                         f"({', '.join(POLICIES)}); known variants include {', '.join(DEFAULT_VARIANTS + STACKS_VARIANTS[1:])}")
    unknown = [m for m in mods if m not in TORCHALLOC_MODIFIERS]
    if unknown:
        raise ValueError(f"variant {text!r}: unknown modifier(s) {', '.join(unknown)} "
                         f"(a policy takes {', '.join('+' + m for m in TORCHALLOC_MODIFIERS)})")
    return Variant(text.strip(), False, tuple(mods), policy=base)


def parse_variants(text: str) -> list[Variant]:
    """A comma-separated list; duplicates and an empty list are errors."""
    names = [t.strip() for t in text.split(",") if t.strip()]
    if not names:
        raise ValueError("no variants given")
    if len(set(names)) != len(names):
        raise ValueError(f"a variant is listed twice in {text!r}")
    return [parse_variant(n) for n in names]
