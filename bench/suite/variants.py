"""Variants: which allocator a run uses, written as NAME[+MODIFIER...].

    native                 PyTorch's caching allocator, PYTORCH_CUDA_ALLOC_CONF unset
    native+expandable      PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    native+async           PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync
    native+history         native, with torch.cuda.memory._record_memory_history(stacks="python")
                           on from before the warm-up (PyTorch's own allocation log with stacks)
    POLICY                 torchalloc through the C++ bridge (torchalloc.install), TORCHALLOC_CONF=policy:POLICY
    POLICY+expandable      ... + expandable:1
    POLICY+compact         ... + expandable:2 (expandable segments compacted before reserving past the high-water mark)
    POLICY+log             ... + log:<temporary file> (the block log, no stacks)
    POLICY+stacks          ... + log:<temporary file>,stacks:1 (the block log with Python stacks)

--extra-conf is appended to every torchalloc variant's TORCHALLOC_CONF.
This is bench/step_time.py's grammar, with `+history` and `+expandable`
added; every torchalloc variant here takes the bridge route, the one users get.
"""
from __future__ import annotations

from dataclasses import dataclass

POLICIES = ("caching", "exact", "phase_arena")
NATIVE_MODIFIERS = {
    "expandable": "expandable_segments:True",
    "async": "backend:cudaMallocAsync",
    "history": "",  # no allocator setting: the child turns PyTorch's memory history on
}
TORCHALLOC_MODIFIERS = ("expandable", "compact", "log", "stacks")
LOG_NAME = "ta_%p.talog"  # in the run's log directory; %p: the child's pid

# What a default run compares (ordered: native first, since ratios are to it).
DEFAULT_VARIANTS = ("native", "native+expandable", "native+async", "caching", "caching+expandable",
                    "caching+compact", "phase_arena", "phase_arena+compact", "exact")
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
        """TORCHALLOC_CONF for a torchalloc variant."""
        conf = [f"policy:{self.policy}"]
        if "compact" in self.modifiers:
            conf.append("expandable:2")
        elif "expandable" in self.modifiers:
            conf.append("expandable:1")
        if self.logs:
            conf.append(f"log:{log_dir.rstrip('/')}/{LOG_NAME}")
        if "stacks" in self.modifiers:
            conf.append("stacks:1")
        if extra_conf.strip(" ,"):
            conf.append(extra_conf.strip(" ,"))
        return ",".join(conf)

    def describe(self, extra_conf: str = "") -> str:
        """The setting in words, for the plan and the tables."""
        if self.native:
            conf = self.native_conf()
            text = f"PYTORCH_CUDA_ALLOC_CONF={conf}" if conf else "PyTorch's caching allocator"
            return text + (", _record_memory_history(stacks='python')" if self.history else "")
        return "TORCHALLOC_CONF=" + self.torchalloc_conf(extra_conf, "LOGDIR")


def parse_variant(text: str) -> Variant:
    """`native[+expandable|+async|+history]` or `POLICY[+expandable|+compact][+log][+stacks]`; ValueError says why not."""
    base, *mods = [part.strip() for part in text.strip().split("+")]
    if len(set(mods)) != len(mods):
        raise ValueError(f"variant {text!r}: a modifier is repeated")
    if base == "native":
        unknown = [m for m in mods if m not in NATIVE_MODIFIERS]
        if unknown or len(mods) > 1:
            raise ValueError(f"variant {text!r}: native takes at most one of "
                             f"{', '.join('+' + m for m in NATIVE_MODIFIERS)}")
        return Variant(text.strip(), True, tuple(mods))
    if base not in POLICIES:
        raise ValueError(f"unknown variant {text!r}: the name is native or a policy "
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
