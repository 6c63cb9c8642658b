"""Finding Slurm's command-line tools, even with no PATH (HealthCheckProgram gets none)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Optional

from autoheal.errors import SlurmError

FALLBACK_DIRS = ("/usr/bin", "/usr/local/bin", "/opt/slurm/bin", "/usr/sbin", "/usr/local/sbin")


def find_binary(name: str, bin_dir: str = "", search_path: Optional[str] = None) -> str:
    """Absolute path of ``name``: ``bin_dir`` first, then PATH (``search_path`` or the process's), then the
    usual install directories."""
    candidates = [Path(bin_dir) / name] if bin_dir else []
    on_path = shutil.which(name, path=search_path)
    if on_path:
        candidates.append(Path(on_path))
    candidates.extend(Path(d) / name for d in FALLBACK_DIRS)
    for path in candidates:
        if path.is_file() and os.access(path, os.X_OK):
            return str(path)
    raise SlurmError(f"{name} not found (looked in {bin_dir or 'PATH'}, {', '.join(FALLBACK_DIRS)}); "
                     f"set slurm.bin_dir in the autoheal config")


def maybe_binary(name: str, bin_dir: str = "") -> Optional[str]:
    """Like ``find_binary`` but None when absent."""
    try:
        return find_binary(name, bin_dir)
    except SlurmError:
        return None
