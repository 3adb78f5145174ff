"""Build and install torchalloc: the C library (through CMake) and the Python package.

`pip install .` runs CMake (-DTORCHALLOC_TESTS=OFF -DCMAKE_BUILD_TYPE=Release)
in a temporary build directory and ships libtorchalloc.so inside the
torchalloc package, where torchalloc._lib finds it first. CMake (and Ninja,
used where there is no `make`) are build requirements in pyproject.toml, so
pip installs them from PyPI into the build environment: only a C11 compiler
must come from the system. The library has no link-time CUDA dependency
(cudart is dlopen'ed at run time), so the wheel builds on a machine without
CUDA.

The package loads the library with ctypes and has no extension module, so
the wheel is tagged py3-none-<platform>: one wheel a platform serves every
Python 3 (>= 3.10), and `pip install dist/*.whl` needs no compiler.

The C++ bridge's source (bridge/torchalloc_bridge.cpp, the headers beside it
and the public header it includes) goes into the package as bridge_src/, so torchalloc.install()
can build it on first use against whatever torch is installed. When torch
with CUDA is importable by the Python that runs pip (asked in a child process
outside pip's build isolation, which hides the installed packages), the
bridge is built now and shipped beside the library instead; a failure there
only warns (first use builds it).
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

try:
    from setuptools.command.bdist_wheel import bdist_wheel  # setuptools >= 70.1
except ImportError:
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:  # an older setuptools without the wheel package can build no wheel: setup() still reads
        bdist_wheel = None

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
    """$CMAKE, else the cmake that pip installed as a build requirement, else the system's."""
    if os.environ.get("CMAKE"):
        return os.environ["CMAKE"]
    try:
        import cmake  # the PyPI package: pyproject.toml's build requirement
        return str(Path(cmake.CMAKE_BIN_DIR) / "cmake")
    except (ImportError, AttributeError):
        pass  # pip install --no-build-isolation without the cmake package: the system's
    found = shutil.which("cmake")
    if found is None:
        sys.exit(
            "torchalloc: building the C library needs CMake >= 3.18 and a C11 compiler, and `cmake` "
            "is not on PATH. Install it (pip install cmake, or apt-get install cmake) and retry."
        )
    return found


def _generator() -> list[str]:
    """CMake's default generator needs `make`; without it, the ninja that pip installed as a build requirement."""
    if shutil.which("make"):
        return []
    try:
        import ninja  # the PyPI package: pyproject.toml's build requirement
        return ["-G", "Ninja", f"-DCMAKE_MAKE_PROGRAM={Path(ninja.BIN_DIR) / 'ninja'}"]
    except (ImportError, AttributeError):
        return []  # let CMake say what is missing


def build_library(out_dir: Path) -> Path:
    """Configure and build libtorchalloc.so in a throwaway directory; copy it to out_dir."""
    cmake = _cmake()
    with tempfile.TemporaryDirectory(prefix="torchalloc-build-") as build_dir:
        configure = [cmake, "-S", str(ROOT), "-B", build_dir, *_generator(),
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


# Run by the Python that runs pip, outside the build environment: builds the bridge into the package
# laid out in build_lib (argv[1]) when that Python's torch has CUDA. Exit 0: built; 3: not now (why on stdout).
BUILD_BRIDGE_SCRIPT = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from torchalloc import bridge
try:
    bridge._torch()
except bridge.BridgeUnavailable as e:
    print(f"not building the C++ bridge now ({e}); torchalloc.install() builds it on first use")
    sys.exit(3)
try:
    bridge.build(Path(sys.argv[1]) / "torchalloc" / bridge.BRIDGE_NAME)
except bridge.BridgeUnavailable as e:
    print(f"warning: the C++ bridge did not build ({e}); torchalloc.install() will try again")
    sys.exit(3)
"""


def outside_build_isolation(env: dict[str, str]) -> dict[str, str]:
    """The environment without pip's build isolation (PYTHONPATH to its overlay, no user site): the installed torch."""
    return {key: value for key, value in env.items() if key not in ("PYTHONPATH", "PYTHONNOUSERSITE")}


def maybe_build_bridge(package_dir: Path) -> None:
    """Build the bridge now when torch with CUDA is importable by the installing Python (else first use builds it)."""
    done = subprocess.run([sys.executable, "-c", BUILD_BRIDGE_SCRIPT, str(package_dir.parent)],
                          env=outside_build_isolation(dict(os.environ)), capture_output=True, text=True)
    said = (done.stdout.strip() or done.stderr.strip()).splitlines()
    if done.returncode == 0:
        print("torchalloc: built the C++ bridge into the package")
    else:
        print(f"torchalloc: {said[-1] if said else f'the bridge probe exited {done.returncode}'}")


class BuildPyWithLibrary(build_py):
    """build_py that also builds the C library (and, when it can, the C++ bridge) into the package."""

    def run(self) -> None:
        super().run()
        package_dir = Path(self.build_lib) / "torchalloc"
        build_library(package_dir)
        copy_bridge_source(package_dir)
        maybe_build_bridge(package_dir)


class BinaryDistribution(Distribution):
    """The wheel carries a shared library: install it as platform-specific (platlib), not pure Python."""

    def has_ext_modules(self) -> bool:
        return True


COMMANDS: dict[str, type] = {"build_py": BuildPyWithLibrary}
if bdist_wheel is not None:
    class PlatformWheel(bdist_wheel):
        """py3-none-<platform>: the library is loaded with ctypes, so no Python version or ABI is in the tag."""

        def get_tag(self) -> tuple[str, str, str]:
            _python, _abi, platform = super().get_tag()
            return "py3", "none", platform

    COMMANDS["bdist_wheel"] = PlatformWheel


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
    # test: what python/tests needs besides numpy (tests/run.sh installs it into a venv of its own when python3
    # lacks it); pytest-xdist runs the suite on every core (run.sh: pytest -n); setuptools >= 70.1 has
    # bdist_wheel, which the wheel tag's test asks.
    extras_require={"test": ["pytest", "pytest-xdist", "setuptools>=70.1"], "plot": ["matplotlib"], "lightning": ["lightning"], "huggingface": ["transformers", "accelerate"]},
    entry_points={"console_scripts": ["torchalloc=torchalloc.cli:main"]},
    cmdclass=COMMANDS,
    distclass=BinaryDistribution,
    # setuptools' default "build/" is the C developers' CMake build directory.
    options={"build": {"build_base": "build-py/setuptools"}},
    zip_safe=False,
)
