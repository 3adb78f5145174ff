"""Several logs of one job: %r and the header's rank, and report / replay / export over a job's logs.

The logs are real: rank_child.py runs once per rank on the simulated
device with $RANK / $WORLD_SIZE set as torchrun sets them, and the library
writes run.%r.talog. What each rank holds is known from rank_child.py:
parameters 4 x 4 MiB on every rank; an optimizer shard of 2 x 8 MiB on
rank 0 and 2 x 6 MiB elsewhere; 3 + 4 * rank activations of 2 MiB in
forward, freed in backward after a 4 MiB gradient. So rank r peaks in
backward at 16 + shard + 2 * (3 + 4r) + 4 MiB.
"""
from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # headless.py, for the page test

from torchalloc.analysis import job as talog_job
from torchalloc.log.reader import read_log

HERE = Path(__file__).resolve().parent
MiB = 1 << 20


def expected_peak(rank: int) -> int:
    shard = 16 if rank == 0 else 12
    return (16 + shard + 2 * (3 + 4 * rank) + 4) * MiB


def write_rank_logs(out: Path, world: int, env_of: dict[str, str] | None = None) -> list[Path]:
    for rank in range(world):
        env = dict(os.environ, PYTHONPATH=str(HERE.parent), RANK=str(rank), LOCAL_RANK=str(rank),
                   WORLD_SIZE=str(world), **(env_of or {}))
        env.pop("TORCHALLOC_CONF", None)
        subprocess.run([sys.executable, str(HERE / "rank_child.py"), str(out)], env=env, check=True, timeout=60)
    return [out / f"run.{r}.talog" for r in range(world)]


@pytest.fixture(scope="module")
def job_logs(library_path: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return write_rank_logs(tmp_path_factory.mktemp("job"), 3)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(HERE.parent))
    env.pop("TORCHALLOC_CONF", None)
    return subprocess.run([sys.executable, "-m", "torchalloc.cli", *args], capture_output=True, text=True, env=env,
                          check=False)


def test_each_rank_writes_its_own_log_with_rank_and_world_size(job_logs: list[Path]) -> None:
    for rank, path in enumerate(job_logs):
        header = read_log(path).header
        assert (header.rank, header.world_size) == (rank, 3)


def test_ranks_side_by_side_and_the_highest_explained(job_logs: list[Path]) -> None:
    job = talog_job.analyze_job(list(reversed(job_logs)))  # the order given does not matter: by rank
    assert [r.rank for r in job.ranks] == [0, 1, 2] and job.world_size == 3
    assert [r.peak_allocated for r in job.ranks] == [expected_peak(r) for r in range(3)]
    assert all(r.phase_at_peak == "backward" for r in job.ranks)
    assert job.ranks[job.highest].rank == 2
    why = job.why_highest()
    assert why.startswith("rank 2 peaked highest: 54.0 MiB") and "phase backward" in why
    # Above rank 0 (the lowest, 42 MiB) by 12 MiB: 16 more MiB of activations, 4 fewer of optimizer shard,
    # so the site named is forward(), +16 MiB; the shard's site is lower on rank 2 and is not named.
    assert "12.0 MiB (29%) above rank 0" in why and "forward +16.0 MiB" in why
    assert "make_optimizer_shard +" not in why


def test_what_the_ranks_share_and_where_they_differ(job_logs: list[Path]) -> None:
    job = talog_job.analyze_job(job_logs)
    shared = {(g.site.split()[-1], g.block_size): g.counts for g in job.shared}
    assert shared[("make_parameters", 4 * MiB)] == [4, 4, 4]
    assert shared[("backward", 4 * MiB)] == [1, 1, 1]
    assert job.shared_bytes == 20 * MiB
    differ = {(g.site.split()[-1], g.block_size): g.counts for g in job.differ}
    assert differ == {("make_optimizer_shard", 8 * MiB): [2, 0, 0], ("make_optimizer_shard", 6 * MiB): [0, 2, 2],
                      ("forward", 2 * MiB): [3, 7, 11]}


def test_report_text_json_and_html_over_a_pattern(job_logs: list[Path], tmp_path: Path) -> None:
    pattern = str(job_logs[0].parent / "run.*.talog")
    done = run_cli("report", pattern)
    assert done.returncode == 0, done.stderr
    assert "3 logs, ranks 0, 1, 2, world size 3" in done.stdout
    assert "rank 2 peaked highest" in done.stdout and "== Shared: 20.0 MiB per rank" in done.stdout
    data = json.loads(run_cli("report", *map(str, job_logs), "--json").stdout)
    assert data["highest"] == 2 and [r["rank"] for r in data["ranks"]] == [0, 1, 2]
    assert [r["peak_allocated"] for r in data["reports"]] == [expected_peak(r) for r in range(3)]
    page = tmp_path / "job.html"
    done = run_cli("report", pattern, "--html", str(page))
    assert done.returncode == 0, done.stderr
    text = page.read_text()
    assert text.count('class="rank-line"') == 6  # allocated and reserved per rank, on one plot
    assert text.count("<details class=\"rank\"") == 3 and "rank 2 peaked highest" in text
    assert "<script" not in text and "http" not in text.split("<body>")[1]  # static, fetches nothing


def test_one_log_is_the_single_report_unchanged(job_logs: list[Path]) -> None:
    done = run_cli("report", str(job_logs[1]))
    assert done.returncode == 0 and done.stdout.startswith(f"torchalloc report: {job_logs[1]} -- device 0")


@pytest.mark.parametrize("args, message", [
    (["report", "/nonexistent/run.*.talog"], "/nonexistent/run.*.talog: no file matches this pattern"),
    (["report", "{0}", "{0}"], "a log is given twice"),
    (["report", "{0}", "{1}", "--at", "peak"], "--at, --png and --progress report one log"),
    (["export", "{0}", "{1}", "-o", "snap.pickle"], "put %r in the name"),
    (["replay", "{0}", "{1}", "--png", "x.png"], "--png plots one trace"),
])
def test_errors_are_one_line(job_logs: list[Path], args: list[str], message: str) -> None:
    done = run_cli(*[a.format(*map(str, job_logs)) for a in args])
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"torchalloc {args[0]}: error: ") and message in lines[0]


def test_export_writes_one_snapshot_per_rank(job_logs: list[Path], tmp_path: Path) -> None:
    done = run_cli("export", *map(str, job_logs), "-o", str(tmp_path / "snap.%r.pickle"))
    assert done.returncode == 0, done.stderr
    for rank in range(3):
        with open(tmp_path / f"snap.{rank}.pickle", "rb") as f:
            snap = pickle.load(f)
        allocs = [e for e in snap["device_traces"][0] if e["action"] == "alloc"]
        assert len(allocs) == 4 + 2 + 2 * (3 + 4 * rank) + 2  # params, shard, two steps' activations and grads


def test_replay_puts_the_ranks_side_by_side(job_logs: list[Path]) -> None:
    done = run_cli("replay", *map(str, job_logs), "--policies", "exact", "--no-search", "--json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert [r["rank"] for r in data["ranks"]] == [0, 1, 2]
    peaks = data["job"]["exact"]["peak_reserved"]
    assert peaks == [expected_peak(r) for r in range(3)]  # exact reserves what is live: sizes are MiB multiples
    assert data["job"]["exact"]["largest_peak_reserved"] == expected_peak(2)
    text = run_cli("replay", *map(str, job_logs), "--policies", "exact", "--no-search").stdout
    assert "== rank 2" in text and "54.00 MiB (rank 2)" in text


def test_logs_without_a_rank_are_numbered_in_order(library_path: Path, tmp_path: Path) -> None:
    """No launcher: %r is 0 and the header says -1; two such logs (different dirs) get ranks by position."""
    a, b = tmp_path / "a", tmp_path / "b"
    for d in (a, b):
        d.mkdir()
        env = dict(os.environ, PYTHONPATH=str(HERE.parent))
        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "TORCHALLOC_CONF"):
            env.pop(name, None)
        subprocess.run([sys.executable, str(HERE / "rank_child.py"), str(d)], env=env, check=True, timeout=60)
    logs = [a / "run.0.talog", b / "run.0.talog"]
    assert read_log(logs[0]).header.rank == -1
    job = talog_job.analyze_job(logs)
    assert [r.rank for r in job.ranks] == [0, 1] and job.world_size == 0
    assert job.notes and "without $RANK" in job.notes[0]
    assert not job.differ  # both ran as rank 0: the same blocks


def test_assign_ranks() -> None:
    assert talog_job.assign_ranks([1, 0]) == ([1, 0], [])
    ranks, notes = talog_job.assign_ranks([1, 1])
    assert ranks == [0, 1] and "same $RANK" in notes[0]


def test_the_job_page_in_chromium_draws_every_rank(job_logs: list[Path], tmp_path: Path) -> None:
    """What a browser builds from the page (an unquoted attribute ending in / would nest the rest of the
    SVG inside one element, and draw nothing after it)."""
    import headless

    binary = headless.browser()
    if binary is None:
        pytest.skip("no Chromium installed")
    page = tmp_path / "job.html"
    assert run_cli("report", *map(str, job_logs), "--html", str(page)).returncode == 0
    dom = headless.parse(headless.dump_dom(binary, headless.page_url(page), tmp_path / "profile"))
    svg = dom.one("svg", "job-timeline")
    drawn = [c for c in svg.children if isinstance(c, headless.Node)]
    lines = [n for n in drawn if n.tag == "polyline"]
    assert [n.attrs["data-rank"] for n in lines] == ["0", "0", "1", "1", "2", "2"]
    assert all(len(n.attrs["points"].split()) >= 2 for n in lines)
    legend = [n.text() for n in drawn if n.tag == "text" and "legend" in n.classes()]
    assert legend[:3] == ["rank 0", "rank 1", "rank 2"]
    assert len(dom.all("details", "rank")) == 3


def test_the_rank_that_ran_out_of_memory_is_named(library_path: Path, tmp_path: Path) -> None:
    logs = write_rank_logs(tmp_path, 3, {"OOM_RANK": "2"})
    job = talog_job.analyze_job([str(p) for p in logs])
    said = job.oom_sentence()
    assert said.startswith("rank 2 ran out of memory at ") and "asking for 2.0 GiB" in said, said
    assert "capacity" in said and "ranks 0, 1 did not." in said, said
    assert [len(r.ooms) for r in job.ranks] == [0, 0, 1]
    assert job.to_dict()["ooms"] == said
    text = run_cli("report", str(tmp_path / "run.*.talog")).stdout
    assert said in text.replace("\n", " ") or "rank 2 ran out of memory" in text
    report = (tmp_path / "run.2.talog.oom-cuda0.txt").read_text().splitlines()
    assert report[0].startswith("torchalloc out-of-memory report: device 0, rank 2 of 3, pid ")
    assert "(rank 2 of 3, stream" in report[2]
    assert not (tmp_path / "run.0.talog.oom-cuda0.txt").exists()


def test_no_oom_is_said_so(job_logs: list[Path]) -> None:
    assert talog_job.analyze_job([str(p) for p in job_logs]).oom_sentence() == "No rank ran out of memory."


def test_the_job_is_analysed_one_rank_at_a_time(job_logs: list[Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """Memory follows one log, not the job: no rank's analysis is still alive when the next one is made."""
    loaded: list[object] = []
    real_analyze = talog_job.analyze

    def counting_analyze(path: object, **kw: object) -> object:
        import gc
        gc.collect()
        alive = [ref() for ref in loaded if ref() is not None]
        assert not alive, f"{len(alive)} earlier analyses still in memory while {path} is read"
        a = real_analyze(path, **kw)
        import weakref
        loaded.append(weakref.ref(a))
        return a

    monkeypatch.setattr(talog_job, "analyze", counting_analyze)
    job = talog_job.analyze_job([str(p) for p in job_logs])
    assert len(loaded) == 3 and [r.rank for r in job.ranks] == [0, 1, 2]
