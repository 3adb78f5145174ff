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

    a = A.analyze(log_path)
    m, _ = a.modules()
    rows = {r.module: r for r in m.rows}
    b = a.blocks
    by_id = {v: k for k, v in m.names.items()}
    for k in range(3):
        name = f"model.{k}"
        assert rows[name].by_phase["forward"] == ACTIVATION + PARAM, (name, rows[name])
        mine = m.module_of == by_id[name]
        what = [A.modules.WHAT[w] for w in m.what_of[mine].tolist()]
        sizes = b.block_size[mine].tolist()
        owned = sorted((w, s) for w, s in zip(what, sizes) if s == PARAM)  # the parameter-sized blocks
        assert owned == [("gradients", PARAM), ("optimizer state", PARAM), ("optimizer state", PARAM),
                         ("parameters", PARAM)], (name, owned)
        in_backward = [s for s, p in zip(sizes, b.alloc_phase[mine].tolist()) if a.phase_name(p) == "backward"]
        assert ACTIVATION in in_backward, (name, in_backward)
    assert m.tags_unmatched == 0
