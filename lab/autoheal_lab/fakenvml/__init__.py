"""A fake ``libnvidia-ml.so.1`` (NVML) for tests and the local lab cluster.

The library (``fake_nvml.c``) is compiled against NVIDIA's own ``nvml.h`` from the PyPI package
``nvidia-nvml-dev`` so the unmodified ``pynvml`` loads it and sees exact signatures and struct
layouts. Each lab node points ``AUTOHEAL_FAKE_NVML_STATE`` (:data:`STATE_ENV`) at its own state file
(see :mod:`autoheal_lab.fakenvml.state`) and puts the build directory on ``LD_LIBRARY_PATH``.

Only the standard library is imported here.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterable, List, Optional

__all__ = [
    "LIB_NAME",
    "SOURCE",
    "STATE_ENV",
    "FakeNvmlBuildError",
    "build_library",
    "find_nvml_header",
]

STATE_ENV = "AUTOHEAL_FAKE_NVML_STATE"
LIB_NAME = "libnvidia-ml.so.1"
SOURCE = Path(__file__).with_name("fake_nvml.c")
HEADER_PACKAGE = "nvidia-nvml-dev"

_CFLAGS = ["-shared", "-fPIC", "-O2", "-pthread", "-Wall", "-Wextra", "-Wl,-z,defs"]
_BUILD_TIMEOUT_S = 120
# Where nvidia-nvml-dev releases put the header, relative to the ``nvidia`` namespace package.
_HEADER_CANDIDATES = (
    "cu13/include/nvml.h",
    "cu12/include/nvml.h",
    "cuda_nvml_dev/include/nvml.h",
    "nvml_dev/include/nvml.h",
    "nvml/include/nvml.h",
)


class FakeNvmlBuildError(RuntimeError):
    """The fake NVML library could not be built (no compiler, no header, compiler error)."""


def _nvidia_dirs() -> List[Path]:
    try:
        spec = importlib.util.find_spec("nvidia")
    except (ImportError, ValueError):
        return []
    if spec is None:
        return []
    locations: Iterable[str] = spec.submodule_search_locations or []
    dirs = [Path(p) for p in locations]
    if not dirs and spec.origin:
        dirs = [Path(spec.origin).parent]
    return dirs


def _header_from_distribution() -> Optional[Path]:
    try:
        from importlib import metadata
    except ImportError:  # pragma: no cover - Python < 3.8
        return None
    try:
        files = metadata.files(HEADER_PACKAGE) or []
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == "nvml.h":
            path = Path(str(f.locate()))
            if path.is_file():
                return path
    return None


def find_nvml_header() -> Path:
    """Return the path of NVIDIA's ``nvml.h`` installed by the pip package ``nvidia-nvml-dev``.

    Raises :class:`FakeNvmlBuildError` naming the package when it cannot be found.
    """
    searched: List[str] = []
    for base in _nvidia_dirs():
        for rel in _HEADER_CANDIDATES:
            candidate = base / rel
            searched.append(str(candidate))
            if candidate.is_file():
                return candidate
        for candidate in sorted(base.glob("*/include/nvml.h")):
            return candidate
    from_dist = _header_from_distribution()
    if from_dist is not None:
        return from_dist
    raise FakeNvmlBuildError(
        f"nvml.h not found: install the pip package {HEADER_PACKAGE!r} "
        f"(pip install {HEADER_PACKAGE}); searched: {', '.join(searched) or 'no nvidia package'}"
    )


def _build_hash(source: bytes, header: bytes, cmd_flags: List[str]) -> str:
    h = hashlib.sha256()
    h.update(b"fake-nvml-build-1\0")
    h.update(hashlib.sha256(source).digest())
    h.update(hashlib.sha256(header).digest())
    h.update("\0".join(cmd_flags).encode())
    return h.hexdigest()


def _one_line(text: str, limit: int = 2000) -> str:
    line = " | ".join(part.strip() for part in text.strip().splitlines() if part.strip())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def build_library(out_dir: Path) -> Path:
    """Compile ``fake_nvml.c`` into ``out_dir/libnvidia-ml.so.1`` and return its path.

    Rebuilds only when the source, the header or the flags changed (a sha256 is stored beside
    the library as ``libnvidia-ml.so.1.sha256``). The library is built under a temporary name
    and moved into place with :func:`os.replace`, so concurrent builders and running users never
    see a half-written file.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / LIB_NAME
    hash_file = out_dir / (LIB_NAME + ".sha256")

    header = find_nvml_header()
    compiler = shutil.which(os.environ.get("CC", "gcc")) or shutil.which("gcc")
    if compiler is None:
        raise FakeNvmlBuildError("gcc not found on PATH: needed to build the fake NVML library")

    flags = _CFLAGS + [f"-I{header.parent}", f"-Wl,-soname,{LIB_NAME}"]
    digest = _build_hash(SOURCE.read_bytes(), header.read_bytes(), flags)
    try:
        if target.is_file() and hash_file.read_text().strip() == digest:
            return target
    except OSError:
        pass

    fd, tmp_name = tempfile.mkstemp(prefix=f".{LIB_NAME}.", suffix=".tmp", dir=out_dir)
    os.close(fd)
    tmp = Path(tmp_name)
    cmd = [compiler, *flags, "-o", str(tmp), str(SOURCE)]
    try:
        try:
            proc = subprocess.run(
                cmd,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=_BUILD_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            raise FakeNvmlBuildError(
                f"{Path(compiler).name} timed out after {_BUILD_TIMEOUT_S}s building {LIB_NAME}"
            ) from None
        if proc.returncode != 0:
            raise FakeNvmlBuildError(
                f"{Path(compiler).name} failed (exit {proc.returncode}) building {LIB_NAME}: "
                f"{_one_line(proc.stderr or proc.stdout)}"
            )
        os.chmod(tmp, 0o755)
        os.replace(tmp, target)
    finally:
        if tmp.exists():
            tmp.unlink()

    fd, tmp_hash = tempfile.mkstemp(prefix=f".{LIB_NAME}.sha256.", suffix=".tmp", dir=out_dir)
    with os.fdopen(fd, "w") as f:
        f.write(digest + "\n")
    os.chmod(tmp_hash, 0o644)
    os.replace(tmp_hash, hash_file)
    return target
