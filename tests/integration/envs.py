"""The cached environments of the heavy test tiers (vLLM CPU, the drafter trainers).

Each is built once by its script under ``scripts/`` (``make test`` starts the builds in the
background) into a folder outside the clone, keyed on its inputs (``scripts/env_path.sh``); a
tier that cannot have its environment skips with the printed reason.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def env_dir(name: str) -> Path:
    """The folder of the tier environment ``name``: ``$DRAFTDATA_<NAME>_VENV`` when set (make
    test sets it), else the cached folder ``scripts/env_path.sh`` names."""
    given = os.environ.get(f"DRAFTDATA_{name.upper()}_VENV")
    if given:
        return Path(given)
    res = subprocess.run(
        ["bash", str(ROOT / "scripts" / "env_path.sh"), name],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(res.stdout.strip())


def cached_env_python(script: str, venv: Path, what: str) -> Path:
    """Build (or reuse) the environment ``venv`` with ``scripts/<script>`` and return its
    python; skip the calling test with the reason when it cannot be built."""
    res = subprocess.run(
        ["bash", str(ROOT / "scripts" / script), str(venv)],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    if res.returncode != 0:
        failed = venv / ".failed"
        why = failed.read_text().strip() if failed.exists() else res.stderr.strip()[-500:]
        print(f"{what} tier skipped: {why}", file=sys.stderr)
        pytest.skip(f"{what} environment unavailable: {why}")
    return venv / "bin" / "python"
