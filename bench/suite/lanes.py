"""Several GPUs of one host side by side: the plan's workloads spread over them, one lane per GPU.

A lane is the runs of some workloads, in the plan's order (rounds
outermost), executed one after another on one GPU while the other lanes run
on theirs. Every run of a workload stays in one lane, so each ratio to
native is still taken on the same card within a round; only the workloads
are spread. Each lane's runs keep to their own whole cores of the host
(`cpu_sets`): side by side on a host of four H200s, with every process free
to use all 64 cores, the small conv net's median step was 1.24-1.40x
native's in three suites under the default, and 0.89-1.03x alone on one
H200 (BENCHMARKS.md, 2026-11-28): a workload whose steps wait for the host
felt its neighbours more than any allocator.
"""
from __future__ import annotations

import os
import subprocess
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from . import runner

Save = Callable[[list[dict[str, Any]], list[str]], None]


def visible_cards() -> list[str]:
    """The GPUs a child may be given, as CUDA_VISIBLE_DEVICES entries: the parent's own CUDA_VISIBLE_DEVICES
    when set, else every GPU nvidia-smi lists (none when it cannot be run)."""
    given = os.environ.get("CUDA_VISIBLE_DEVICES")
    if given is not None:
        return [c.strip() for c in given.split(",") if c.strip()]
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [str(i) for i, line in enumerate(listed.stdout.splitlines()) if line.startswith("GPU ")]


SIBLINGS = "/sys/devices/system/cpu/cpu{}/topology/thread_siblings_list"


def read_siblings(cpu: int) -> str | None:
    """The kernel's list of the logical CPUs that share `cpu`'s physical core ("3,35", "0-1"); None unknown."""
    try:
        return Path(SIBLINGS.format(cpu)).read_text().strip()
    except OSError:
        return None


def _parse_cpu_list(text: str) -> set[int]:
    found: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.strip().partition("-")
        if lo.isdigit() and (not hi or hi.isdigit()):
            found.update(range(int(lo), int(hi or lo) + 1))
    return found


def physical_cores(cpus: list[int], siblings: Callable[[int], str | None] | None = None) -> list[list[int]]:
    """`cpus` grouped by physical core (hyperthreads together), in order of each core's lowest id; a CPU whose
    siblings are unknown is a core of its own. `siblings`: read_siblings (looked up at the call) unless given."""
    siblings = siblings or read_siblings
    allowed, cores, seen = set(cpus), [], set()
    for cpu in sorted(cpus):
        if cpu in seen:
            continue
        listed = siblings(cpu)
        core = sorted((_parse_cpu_list(listed) & allowed) | {cpu}) if listed else [cpu]
        seen.update(core)
        cores.append(core)
    return cores


def cpu_sets(count: int, siblings: Callable[[int], str | None] | None = None) -> list[list[int]] | None:
    """The CPUs this process may use, cut into `count` disjoint sets of whole physical cores, one a lane (their
    children are pinned there, and their thread pools sized to it: runner.child_env); None for one lane, or
    fewer cores than lanes. Why whole cores: on a host whose CPUs n and n+32 are two threads of one core, sets
    of consecutive ids would give two lanes halves of the same cores, and a workload that waits for the host
    would still feel its neighbour."""
    cpus = sorted(os.sched_getaffinity(0))
    cores = physical_cores(cpus, siblings)
    if count < 2 or len(cores) < count:
        return None
    per, extra = divmod(len(cores), count)
    sets, start = [], 0
    for lane in range(count):
        size = per + (1 if lane < extra else 0)
        sets.append(sorted(cpu for core in cores[start:start + size] for cpu in core))
        start += size
    return sets


def split(runs: list[runner.Run], count: int, warmup: int) -> list[list[runner.Run]]:
    """At most `count` lanes: each workload, longest estimate first, to the lane with the least estimated time
    so far; within a lane the plan's order. Lanes left empty (fewer workloads than GPUs) are dropped."""
    cost: dict[str, float] = {}
    for run in runs:
        cost[run.spec.name] = cost.get(run.spec.name, 0.0) + run.estimate_s(warmup)
    totals = [0.0] * count
    lane_of: dict[str, int] = {}
    for name in sorted(cost, key=lambda n: -cost[n]):
        lane = min(range(count), key=lambda i: (totals[i], i))
        lane_of[name] = lane
        totals[lane] += cost[name]
    lanes: list[list[runner.Run]] = [[] for _ in range(count)]
    for run in runs:
        lanes[lane_of[run.spec.name]].append(run)
    return [lane for lane in lanes if lane]


def describe(lanes: list[list[runner.Run]], cards: list[str], warmup: int) -> list[str]:
    """One line a lane: its card, its workloads and its estimated time."""
    lines = []
    for lane, card in zip(lanes, cards):
        names = ", ".join(dict.fromkeys(r.spec.name for r in lane))
        minutes = sum(r.estimate_s(warmup) for r in lane) / 60
        lines.append(f"card {card}: {names} ({len(lane)} runs, estimated {minutes:.1f} min)")
    return lines


RunLane = Callable[[list[runner.Run], str, Save, list[int] | None], tuple[list[dict[str, Any]], list[str]]]


def execute(lanes: list[list[runner.Run]], cards: list[str], run_lane: RunLane, save: Save
            ) -> tuple[list[dict[str, Any]], list[str]]:
    """Each lane on its card at the same time, on its share of the CPUs (`run_lane(runs, card, save, cpus)`,
    runner.execute with the card and CPUs given); (every lane's records, in lane order, and notes). `save`
    gets all the records so far after any lane's run."""
    cpus = cpu_sets(len(lanes))
    done: list[tuple[list[dict[str, Any]], list[str]]] = [([], []) for _ in lanes]
    lock = threading.Lock()

    def saver(index: int) -> Save:
        def save_lane(records: list[dict[str, Any]], notes: list[str]) -> None:
            with lock:
                done[index] = (list(records), list(notes))
                save([r for recs, _ in done for r in recs], [n for _, ns in done for n in ns])
        return save_lane

    def work(index: int) -> None:
        try:
            done_here = run_lane(lanes[index], cards[index], saver(index), cpus[index] if cpus else None)
        except Exception as e:  # a lane's failure is reported with what it had recorded; the other lanes go on
            with lock:
                done[index] = (done[index][0], done[index][1] + [f"card {cards[index]}: the lane stopped: {e!r}"])
            return
        with lock:
            done[index] = done_here

    threads = [threading.Thread(target=work, args=(i,), name=f"lane-{cards[i]}") for i in range(len(lanes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    records = [r for recs, _ in done for r in recs]
    notes = [n for _, ns in done for n in ns]
    save(records, notes)
    return records, notes


def run_lane_with(script: Path, child_args: Callable[[runner.Run], list[str]], lib: Path, extra_conf: str,
                  warmup: int, timeout: float, budget_s: float, started: float) -> RunLane:
    """runner.execute for one lane, with everything but the runs, the card, the saver and the CPUs fixed."""
    def run_lane(runs: list[runner.Run], card: str, save: Save, cpus: list[int] | None
                 ) -> tuple[list[dict[str, Any]], list[str]]:
        return runner.execute(runs, script, child_args, lib, extra_conf, warmup, timeout, budget_s, save, started,
                              card, cpus)
    return run_lane
