"""`torchalloc info` on a machine without a GPU says so (issue 50): cudart's own words there, "CUDA driver
version is insufficient for CUDA runtime version", read as an old driver."""
from __future__ import annotations

import ctypes
import json
from pathlib import Path

import pytest

from cli_in_process import cli


def _has_driver() -> bool:
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False
    return True


@pytest.mark.skipif(_has_driver(), reason="an NVIDIA driver is installed: info describes its GPUs")
def test_info_says_there_is_no_gpu_driver(library_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TORCHALLOC_CONF", raising=False)
    status, out, err = cli("info", "--json")
    assert status == 0, err
    message = json.loads(out)["device_error"]
    assert "no NVIDIA driver is installed" in message or message.startswith("cannot load libcudart"), message
    assert "use backend:sim where there is no GPU" in message
