"""Choosing the route without a GPU: when the C++ bridge is used, built, found, or refused, and why.

The bridge's own behaviour inside PyTorch is tested on a GPU
(test_bridge_gpu.py); here: the cache key, the reasons install() gives for
the plain route, $TORCHALLOC_BRIDGE, and that the source ships with the
package.
"""
from __future__ import annotations

import types
from pathlib import Path

import pytest

from torchalloc import bridge, plug


def fake_torch(version: str = "2.11.0+cu130", cuda: str | None = "13.0") -> types.SimpleNamespace:
    return types.SimpleNamespace(__version__=version, version=types.SimpleNamespace(cuda=cuda))


def test_the_source_is_found_and_hashed() -> None:
    root = bridge.source_root()
    assert (root / bridge.SOURCE_RELATIVE).is_file() and (root / bridge.HEADER_RELATIVE).is_file()
    assert len(bridge.source_hash(root)) == 16


def test_every_file_the_bridge_includes_is_part_of_its_source(tmp_path: Path) -> None:
    root = bridge.source_root()
    included = {line.split('"')[1] for line in (root / bridge.SOURCE_RELATIVE).read_text().splitlines()
                if line.startswith('#include "bridge_')}
    assert included == {h.name for h in bridge.BRIDGE_HEADERS}  # a header of its own not listed would not ship
    for relative in (bridge.SOURCE_RELATIVE, bridge.HEADER_RELATIVE, *bridge.BRIDGE_HEADERS):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / relative).write_bytes((root / relative).read_bytes())
    before = bridge.source_hash(tmp_path)
    header = tmp_path / bridge.BRIDGE_HEADERS[-1]
    header.write_text(header.read_text() + "\n")
    assert bridge.source_hash(tmp_path) != before  # a changed header rebuilds the bridge


def test_the_cache_key_names_every_version_and_the_source(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(bridge.ENV_CACHE, str(tmp_path))
    path = bridge.cached_path(fake_torch())
    assert path.parent.parent == tmp_path and path.name == bridge.BRIDGE_NAME
    key = path.parent.name
    assert "torch2.11.0+cu130" in key and "cuda13.0" in key and bridge.source_hash(bridge.source_root()) in key
    other = bridge.cached_path(fake_torch("2.12.0+cu130"))
    assert other != path  # another torch never loads this build


def test_no_torch_means_the_plain_route_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_torch() -> None:
        raise bridge.BridgeUnavailable("torch is not importable (No module named 'torch')")

    monkeypatch.setattr(bridge, "_torch", no_torch)
    found, why = plug._choose_bridge(None)
    assert found is None and why == "the C++ bridge is unavailable: torch is not importable (No module named 'torch')"
    with pytest.raises(RuntimeError, match="install\\(bridge=True\\) but the C\\+\\+ bridge is unavailable"):
        plug._choose_bridge(True)
    assert plug._choose_bridge(False) == (None, "install(bridge=False)")
    described = bridge.describe()
    assert described["bridge"] == "unavailable" and "torch is not importable" in described["bridge_reason"]


def test_torch_without_cuda_or_a_compiler_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "torch", fake_torch(cuda=None))
    with pytest.raises(bridge.BridgeUnavailable, match="built without CUDA"):
        bridge._torch()
    monkeypatch.setenv("CXX", "/nonexistent/c++")
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(bridge.BridgeUnavailable, match="no C\\+\\+ compiler"):
        bridge.compiler()


def test_the_environment_turns_it_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(bridge.ENV_BRIDGE, "0")
    with pytest.raises(bridge.BridgeUnavailable, match="TORCHALLOC_BRIDGE=0"):
        bridge.find_or_build()
    found, why = plug._choose_bridge(None)
    assert found is None and "TORCHALLOC_BRIDGE=0" in why
