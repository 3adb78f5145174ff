"""Memory by module on a real GPU (issue 25 item 3): a model whose per-layer activation sizes are known.

Three `Scale` layers (x * w, w of WIDTH floats) on a BATCH x WIDTH input:
each layer's forward allocates its output, BATCH*WIDTH*4 bytes = 4 MiB,
which the next layer (or the loss) keeps, and owns a 16 KiB parameter. So at
the forward phase's peak each of model.0, model.1, model.2 holds exactly
4 MiB + 16 KiB; after backward and AdamW's step each owns its parameter, one
16 KiB gradient and two 16 KiB optimizer-state blocks (exp_avg, exp_avg_sq);
and each layer's backward allocates at least one 4 MiB block attributed to
it. Skipped without torch or a CUDA GPU; runs in a fresh process because
install() must precede CUDA initialisation. Command:

    python3 -m pytest -q python/tests/test_modules_gpu.py
"""
from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="torch is not installed")
if not torch.cuda.is_available():
    pytest.skip("no CUDA GPU visible to torch", allow_module_level=True)

from gpu_child import run_logged_script  # noqa: E402

from torchalloc import analysis as A  # noqa: E402

BATCH, WIDTH = 256, 4096
ACTIVATION = BATCH * WIDTH * 4
PARAM = WIDTH * 4

SCRIPT = textwrap.dedent(
    f"""\
    import sys
    import torch, torchalloc
    torchalloc.install(policy="caching", log=sys.argv[1])

    class Scale(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.rand({WIDTH}, device="cuda") + 0.5)

        def forward(self, x):
            return x * self.w

    model = torch.nn.Sequential(Scale(), Scale(), Scale())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=False)
    handle = torchalloc.track(model, opt)
    x = torch.randn({BATCH}, {WIDTH}, device="cuda")
    loss = model(x).sum()
    loss.backward()
    opt.step()
    torch.cuda.synchronize()
    print("ok", float(loss))
    """
)


def test_bytes_per_layer(library_path: Path, tmp_path: Path) -> None:
    log_path = run_logged_script(SCRIPT, library_path, tmp_path)

    from torchalloc.report.data import page_data

    a = A.analyze(log_path)
    m, _ = a.modules()
    rows = {r.module: r for r in m.rows}
    # Per block, as the HTML page lists them: its module and what it is to it (a short run: the page holds them all)
    d = page_data(a)
    b = d["blocks"]
    assert len(b["id"]) == len(a.blocks), "the page does not hold every block of this run"
    module = [d["module_names"][i] if i >= 0 else None for i in b["module"]]
    what = [d["module_what"][w] for w in b["module_what"]]
    phase = [d["phase_names"][p] for p in b["phase"]]
    for k in range(3):
        name = f"model.{k}"
        assert rows[name].by_phase["forward"] == ACTIVATION + PARAM, (name, rows[name])
        mine = [j for j, n in enumerate(module) if n == name]
        owned = sorted((what[j], b["size"][j]) for j in mine if b["size"][j] == PARAM)  # the parameter-sized blocks
        assert owned == [("gradients", PARAM), ("optimizer state", PARAM), ("optimizer state", PARAM),
                         ("parameters", PARAM)], (name, owned)
        in_backward = [b["size"][j] for j in mine if phase[j] == "backward"]
        assert ACTIVATION in in_backward, (name, in_backward)
    assert m.tags_unmatched == 0
