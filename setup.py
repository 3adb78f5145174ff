"""Build and install torchalloc: the C library (through CMake) and the Python package.

`pip install .` runs CMake (-DTORCHALLOC_TESTS=OFF -DCMAKE_BUILD_TYPE=Release)
in a temporary build directory and ships libtorchalloc.so inside the
torchalloc package, where torchalloc._lib finds it first. CMake and a C
compiler come from the system; the library has no link-time CUDA dependency
(cudart is dlopen'ed at run time), so the wheel builds on a machine without
CUDA.

The C++ bridge's source (bridge/torchalloc_bridge.cpp, the headers beside it
and the public header it includes) goes into the package as bridge_src/, so torchalloc.install()
can build it on first use against whatever torch is installed. When torch
with CUDA is importable during the build itself (pip install
--no-build-isolation .), the bridge is built now and shipped beside the
library instead; a failure there only warns (first use builds it).
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from setuptools import Distribution, find_packages, setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
LIB_NAME = "libtorchalloc.so"


def package_version() -> str:
    """__version__ of python/torchalloc/__init__.py: the one place the version is written."""
    init = (ROOT / "python" / "torchalloc" / "__init__.py").read_text(encoding="utf-8")
    found = re.search(r'^__version__ = "([^"]+)"', init, re.MULTILINE)
    if found is None:
        sys.exit("torchalloc: python/torchalloc/__init__.py has no __version__ = \"...\" line")
    return found.group(1)


def _cmake() -> str:
    cmake = shutil.which(os.environ.get("CMAKE", "cmake"))
    if cmake is None:
        sys.exit(
            "torchalloc: building the C library needs CMake >= 3.18 and a C11 compiler, and `cmake` "
            "is not on PATH. Install it (apt-get install cmake, or pip install cmake) and retry."
        )
    return cmake


def build_library(out_dir: Path) -> Path:
    """Configure and build libtorchalloc.so in a throwaway directory; copy it to out_dir."""
    cmake = _cmake()
    with tempfile.TemporaryDirectory(prefix="torchalloc-build-") as build_dir:
        configure = [cmake, "-S", str(ROOT), "-B", build_dir,
                     "-DTORCHALLOC_TESTS=OFF", "-DCMAKE_BUILD_TYPE=Release"]
        subprocess.run(configure, check=True)
        jobs = str(os.cpu_count() or 1)
        subprocess.run([cmake, "--build", build_dir, "--target", "torchalloc", "-j", jobs], check=True)
        built = Path(build_dir) / LIB_NAME
        if not built.is_file():
            sys.exit(f"torchalloc: CMake finished but produced no {built}")
        out_dir.mkdir(parents=True, exist_ok=True)
        target = out_dir / LIB_NAME
        shutil.copy2(built, target)
        return target


def copy_bridge_source(package_dir: Path) -> None:
    """The bridge's source, laid out as in the repository, under the package's bridge_src/."""
    headers = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "bridge").glob("*.h"))  # the files it includes
    for relative in ("bridge/torchalloc_bridge.cpp", *headers, "include/torchalloc.h"):
        target = package_dir / "bridge_src" / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / relative, target)


def maybe_build_bridge(package_dir: Path) -> None:
    """Build the bridge now when torch with CUDA is importable here (else first use builds it)."""
    sys.path.insert(0, str(package_dir.parent))
    try:
        from torchalloc import bridge  # the copy just laid out in build_lib
    finally:
        sys.path.pop(0)
    try:
        bridge._torch()
    except bridge.BridgeUnavailable as e:
        print(f"torchalloc: not building the C++ bridge now ({e}); torchalloc.install() builds it on first use")
        return
    try:
        bridge.build(package_dir / bridge.BRIDGE_NAME)
    except bridge.BridgeUnavailable as e:
        print(f"torchalloc: warning: the C++ bridge did not build ({e}); torchalloc.install() will try again")


class BuildPyWithLibrary(build_py):
    """build_py that also builds the C library (and, when it can, the C++ bridge) into the package."""

    def run(self) -> None:
        super().run()
        package_dir = Path(self.build_lib) / "torchalloc"
        build_library(package_dir)
        copy_bridge_source(package_dir)
        maybe_build_bridge(package_dir)


class BinaryDistribution(Distribution):
    """The wheel carries a shared library: tag it for this platform, not pure Python."""

    def has_ext_modules(self) -> bool:
        return True


setup(
    name="torchalloc",
    version=package_version(),
    description="A CUDA memory allocator for PyTorch that explains itself",
    python_requires=">=3.10",
    package_dir={"": "python"},
    packages=find_packages(where="python", exclude=["tests", "tests.*"]),
    package_data={"torchalloc": [LIB_NAME, "data/*", "report/page.js", "report/units.js", "report/labels.js", "report/page.css", "report/page_help.md", "bridge_src/*/*", "libtorchalloc_bridge.so"]},
    # numpy 1.21.2 is the oldest with wheels for Python 3.10 (python_requires); the offline tools' tests pass
    # on it and on numpy 2 (python/tests/test_mid_run_logs.py names the difference that once mattered).
    install_requires=["numpy>=1.21.2", "tqdm"],
    extras_require={"plot": ["matplotlib"], "lightning": ["lightning"], "huggingface": ["transformers", "accelerate"]},
    entry_points={"console_scripts": ["torchalloc=torchalloc.cli:main"]},
    cmdclass={"build_py": BuildPyWithLibrary},
    distclass=BinaryDistribution,
    # setuptools' default "build/" is the C developers' CMake build directory.
    options={"build": {"build_base": "build-py/setuptools"}},
    zip_safe=False,
)
