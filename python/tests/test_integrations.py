"""The trainer integrations on the simulated device, without a GPU.

- StepPhases / Session (no torch needed): the hook sequence becomes
  properly nested phases and markers in the log; the program's own phases
  left open across a hook stop the marking with a warning, never an
  exception; the report is written from the log at the end.
- Lightning and the Hugging Face Trainer, where installed: a real fit /
  train() on the CPU with the callback (install=False: the sim device is
  set up here), and the phases, markers and attributions in the log are
  the ones each trainer's hook order must give. Skipped, with the reason,
  where the library is missing (CI has neither; the device machine runs them).
"""
from __future__ import annotations

import ctypes
import warnings
from pathlib import Path
from typing import Any, Iterator

import pytest
from conftest import SIM_CONF

from torchalloc import _lib, phases
from torchalloc.log.reader import read_log

MiB = 1 << 20


@pytest.fixture
def sim_log(library_path: Path, tmp_path: Path) -> Iterator[tuple[ctypes.CDLL, Path]]:
    path = tmp_path / "run.talog"
    _lib.init(f"{SIM_CONF},log:{path}")
    try:
        yield _lib.lib(), path
    finally:
        _lib.teardown()


def labelled(path: Path) -> list[tuple[str, str]]:
    """(kind, label) of every phase_begin, phase_end and marker record, in log order."""
    log = read_log(path, warn=False)
    rows = log.of_kind("phase_begin", "phase_end", "marker")
    names = {7: "begin", 8: "end", 9: "mark"}
    return [(names[int(r["kind"])], log.label(r)) for r in rows]


def alloc_phases(path: Path) -> list[str]:
    log = read_log(path, warn=False)
    return [log.phase_names[int(r["phase"])] for r in log.of_kind("alloc")]


def session(**kw: Any) -> Any:
    from torchalloc.integrations._session import Session

    args: dict[str, Any] = dict(policy=None, log=None, stacks=None, report=True, install=False, conf={})
    args.update(kw)
    return Session("test", **args)


def test_step_parts_nest_and_follow_each_other(sim_log: tuple[ctypes.CDLL, Path]) -> None:
    lib, path = sim_log
    s = session()
    assert s.active and s.log_path == str(path)
    held = []
    for step in range(2):
        s.mark(f"step {step}")
        for part in ("forward", "zero_grad", "backward"):
            s.part(part)
            held.append(lib.torchalloc_malloc(MiB, 0, None))
        s.end_part()  # on_after_backward
        s.part("optimizer")
        held.append(lib.torchalloc_malloc(MiB, 0, None))
        s.end_part()
    s.enter("validation")
    s.part("forward")  # a part inside a span
    held.append(lib.torchalloc_malloc(MiB, 0, None))
    s.leave("validation")  # ends the part too
    s.leave("validation")  # not open: nothing
    assert phases.current_phase() == "default"
    step = [("begin", "forward"), ("end", "forward"), ("begin", "zero_grad"), ("end", "zero_grad"),
            ("begin", "backward"), ("end", "backward"), ("begin", "optimizer"), ("end", "optimizer")]
    assert labelled(path) == ([("mark", "step 0")] + step + [("mark", "step 1")] + step +
                              [("begin", "validation"), ("begin", "forward"), ("end", "forward"),
                               ("end", "validation")])
    assert alloc_phases(path) == ["forward", "zero_grad", "backward", "optimizer"] * 2 + ["forward"]
    for p in held:
        lib.torchalloc_free(p, MiB, 0, None)


def test_the_same_part_twice_stays_one_phase(sim_log: tuple[ctypes.CDLL, Path]) -> None:
    _, path = sim_log
    s = session()
    s.part("forward")
    s.part("forward")
    s.finish()
    assert labelled(path)[:2] == [("begin", "forward"), ("end", "forward")]


def test_an_open_user_phase_stops_the_marking_with_a_warning(sim_log: tuple[ctypes.CDLL, Path]) -> None:
    _, path = sim_log
    s = session(report=False)
    s.part("forward")
    phases.begin("mine")  # the program's own phase, left open across the trainer's next hook
    with pytest.warns(RuntimeWarning, match="cannot end phase 'forward'"):
        s.part("backward")
    assert not s.steps.enabled
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s.part("optimizer")  # no further warnings, no exception
        s.finish()
    assert phases.current_phase() == "mine"
    phases.end("mine")
    phases.end("forward")


def test_finish_writes_the_report(sim_log: tuple[ctypes.CDLL, Path], capsys: pytest.CaptureFixture[str]) -> None:
    lib, path = sim_log
    s = session()
    s.part("forward")
    p = lib.torchalloc_malloc(3 * MiB, 0, None)
    s.part("backward")
    q = lib.torchalloc_malloc(5 * MiB, 0, None)
    lib.torchalloc_free(p, 3 * MiB, 0, None)
    r = s.finish("fit ended")
    assert r is not None and s.report is r
    text = Path(r.text).read_text()
    assert r.text == str(path.with_suffix("")) + ".report.txt" and Path(r.html).is_file()
    assert "forward" in text and "backward" in text
    assert "peak allocated 8.0 MiB" in r.summary  # 3 MiB + 5 MiB live together
    assert "report:" in capsys.readouterr().err
    assert labelled(path)[-1] == ("mark", "fit ended")
    lib.torchalloc_free(q, 5 * MiB, 0, None)


def test_a_report_that_fails_warns_and_training_ends_normally(sim_log: tuple[ctypes.CDLL, Path]) -> None:
    _, path = sim_log
    s = session()
    s.log_path = str(path.parent / "missing" / "gone.talog")
    with pytest.warns(RuntimeWarning, match="could not write the report"):
        assert s.finish() is None


def test_without_a_log_there_is_no_report_and_no_error(library_path: Path) -> None:
    _lib.init(SIM_CONF)
    try:
        s = session()
        s.part("forward")
        s.mark("step 0")  # no log: dropped silently
        assert s.finish() is None
        assert phases.current_phase() == "default"
    finally:
        _lib.teardown()


# ---------------------------------------------------------------------------
# Real trainers on the CPU
# ---------------------------------------------------------------------------


def _cpu_trainer_reason(*modules: str) -> str | None:
    for module in ("torch",) + modules:
        try:
            __import__(module)
        except ImportError as e:
            return f"{e.name or module} is not installed (pip install {module.split('.')[0]})"
    return None


def test_lightning_fit_marks_phases_in_lightning_hook_order(sim_log: tuple[ctypes.CDLL, Path]) -> None:
    why = _cpu_trainer_reason("lightning.pytorch")
    if why:
        pytest.skip(why)
    import lightning.pytorch as L
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from torchalloc.integrations.lightning import TorchallocCallback

    lib, path = sim_log
    held: list[int] = []

    def sim_alloc() -> None:  # a block on the sim device, in whatever phase is current
        held.append(lib.torchalloc_malloc(MiB, 0, None))

    class AllocatingAdam(torch.optim.Adam):
        def step(self, closure: Any = None) -> Any:
            loss = super().step(closure)  # the closure: training_step, zero_grad, backward
            sim_alloc()  # the update
            return loss

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            sim_alloc()
            loss = self.layer(batch[0]).pow(2).mean()
            loss.register_hook(lambda g: sim_alloc())  # runs inside backward
            return loss

        def validation_step(self, batch: Any, batch_idx: int) -> None:
            sim_alloc()

        def configure_optimizers(self) -> Any:
            return AllocatingAdam(self.parameters(), lr=0.1)

    data = DataLoader(TensorDataset(torch.randn(8, 4)), batch_size=4)
    callback = TorchallocCallback(install=False)
    trainer = L.Trainer(accelerator="cpu", max_epochs=2, callbacks=[callback], logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=1, limit_val_batches=1)
    trainer.fit(Module(), data, data)

    step = [("begin", "forward"), ("end", "forward"), ("begin", "zero_grad"), ("end", "zero_grad"),
            ("begin", "backward"), ("end", "backward"), ("begin", "optimizer"), ("end", "optimizer")]
    validation = [("begin", "validation"), ("end", "validation")]
    expected = list(validation)  # the sanity check
    for epoch in range(2):
        expected += [("mark", f"epoch {epoch}")]
        for s in range(2):
            expected += [("mark", f"step {2 * epoch + s}")] + step
        expected += validation
    expected += [("mark", "fit ended")]
    assert labelled(path) == expected
    assert alloc_phases(path) == ["validation"] + (["forward", "backward", "optimizer"] * 2 + ["validation"]) * 2
    assert callback.report is not None and Path(callback.report.html).is_file()
    for p in held:
        lib.torchalloc_free(p, MiB, 0, None)


def test_huggingface_trainer_marks_phases(sim_log: tuple[ctypes.CDLL, Path], tmp_path: Path) -> None:
    why = _cpu_trainer_reason("transformers", "accelerate")
    if why:
        pytest.skip(why)
    import torch
    from transformers import Trainer, TrainingArguments

    from torchalloc.integrations.huggingface import TorchallocCallback

    lib, path = sim_log
    held: list[int] = []
    seen: list[str] = []

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def forward(self, x: torch.Tensor, labels: torch.Tensor) -> dict[str, torch.Tensor]:
            seen.append(phases.current_phase())
            held.append(lib.torchalloc_malloc(MiB, 0, None))
            loss = (self.layer(x).squeeze(-1) - labels).pow(2).mean()
            if loss.requires_grad:
                loss.register_hook(lambda g: seen.append(phases.current_phase()))
            return {"loss": loss}

    class Data(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return {"x": torch.full((4,), float(i)), "labels": torch.tensor(float(i))}

    callback = TorchallocCallback(install=False)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=4, per_device_train_batch_size=2,
                             per_device_eval_batch_size=4, gradient_accumulation_steps=2, eval_strategy="steps",
                             eval_steps=2, logging_strategy="no", save_strategy="no", report_to=[], use_cpu=True,
                             disable_tqdm=True)
    Trainer(model=Tiny(), args=args, train_dataset=Data(), eval_dataset=Data(), callbacks=[callback]).train()

    records = labelled(path)
    marks = [label for kind, label in records if kind == "mark"]
    assert marks == ["epoch 0", "step 0", "step 1", "epoch 1", "step 2", "step 3", "training ended"]
    begun = [label for kind, label in records if kind == "begin"]
    micro = ["forward", "backward"]
    step = micro * 2 + ["optimizer", "zero_grad"]  # two micro-batches per optimizer step
    evaluation = ["evaluation"] * 2  # 8 samples, 4 per batch
    assert begun == step * 2 + evaluation + step * 2 + evaluation
    assert seen[:4] == ["forward", "backward", "forward", "backward"]
    assert "evaluation" in seen and phases.current_phase() == "default"
    assert callback.report is not None
    # track() is removed at the end: a forward now is in no phase
    for p in held:
        lib.torchalloc_free(p, MiB, 0, None)
