"""Build and install torchalloc: the C library (through CMake) and the Python package.

`pip install .` runs CMake (-DTORCHALLOC_TESTS=OFF -DCMAKE_BUILD_TYPE=Release)
in a temporary build directory and ships libtorchalloc.so inside the
torchalloc package, where torchalloc._lib finds it first. CMake and a C
compiler come from the system; the library has no link-time CUDA dependency
(cudart is dlopen'ed at run time), so the wheel builds on a machine without
CUDA.
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


class BuildPyWithLibrary(build_py):
    """build_py that also builds the C library into the package."""

    def run(self) -> None:
        super().run()
        build_library(Path(self.build_lib) / "torchalloc")


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
    package_data={"torchalloc": [LIB_NAME, "data/*"]},
    install_requires=["numpy", "tqdm"],
    extras_require={"plot": ["matplotlib"]},
    entry_points={"console_scripts": ["torchalloc=torchalloc.cli:main"]},
    cmdclass={"build_py": BuildPyWithLibrary},
    distclass=BinaryDistribution,
    # setuptools' default "build/" is the C developers' CMake build directory.
    options={"build": {"build_base": "build-py/setuptools"}},
    zip_safe=False,
)
