"""scripts/sglang_kit.sh and env_path.sh: which folder the SGLang tier's environment is built
from, and its key, on CPUs that can and cannot load the SGLang CPU kit's kernels.

Judged on a copy of scripts/ (a clone with no kit beside it, or with one) and on CPUs described
by a cpuinfo file ($DRAFTDATA_CPUINFO), as sglang_cpu_check.sh reads them.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
NEEDED = ["avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd", "avx512_bf16", "avx512_vnni"]
REQS = "sglang-0.5.23-cpu-requirements.txt"


def _run(script: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(script), *args], capture_output=True, text=True, env=env, timeout=60
    )


def _clone(where: Path, kit: bool) -> Path:
    """``where/clone/scripts`` (a copy of ours), and ``where/shared/sglang-cpu`` if ``kit``."""
    clone = where / "clone"
    shutil.copytree(ROOT / "scripts", clone / "scripts")
    if kit:
        k = where / "shared" / "sglang-cpu"
        k.mkdir(parents=True)
        (k / REQS).write_text("numpy\n")
        (k / "sglang_kernel_cpu-0.4.6.post1-cp311-cp311-linux_x86_64.whl").write_bytes(b"w")
        (k / "sglang-kernel-cpu-src-7f8f0300.tar.gz").write_bytes(b"t")
    return clone


@settings(max_examples=12, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    flags=st.sets(st.sampled_from([*NEEDED, "avx2", "amx_tile"])),
    all_needed=st.booleans(),
)
def test_the_kit_is_used_only_where_its_kernels_load(
    tmp_path_factory: pytest.TempPathFactory, flags: set[str], all_needed: bool
) -> None:
    if all_needed:
        flags |= set(NEEDED)
    capable = set(NEEDED) <= flags
    root = tmp_path_factory.mktemp("cpu")
    cpuinfo = root / "cpuinfo"
    cpuinfo.write_text(f"model name\t: test CPU\nflags\t\t: fpu sse2 {' '.join(sorted(flags))}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DRAFTDATA_")}
    env |= {"DRAFTDATA_CPUINFO": str(cpuinfo), "DRAFTDATA_ENV_CACHE": str(root / "cache")}
    found: dict[bool, tuple[subprocess.CompletedProcess[str], str]] = {}
    for kit in (False, True):
        clone = _clone(root / f"kit{kit}", kit)
        scripts = clone / "scripts"
        key = _run(scripts / "env_path.sh", "sglang", env=env)
        assert key.returncode == 0, key.stderr
        found[kit] = (_run(scripts / "sglang_kit.sh", env=env), key.stdout.strip())
        res = found[kit][0]
        if not capable:  # the repository's requirements list, the kit found or not
            assert res.returncode == 0 and Path(res.stdout.strip()) == scripts / "sglang-cpu"
            assert (Path(res.stdout.strip()) / REQS).is_file()
        elif kit:
            assert res.returncode == 0
            assert Path(res.stdout.strip()) == (clone.parent / "shared" / "sglang-cpu").resolve()
        else:
            assert res.returncode == 1 and "DRAFTDATA_SGLANG_CPU" in res.stderr
    keys = {kit: Path(k).name for kit, (_, k) in found.items()}
    if capable:  # the kit's files are inputs of the environment: another key
        assert keys[True] != keys[False]
    else:  # the kit is no input here: the same environment, whether a clone has it or not
        assert keys[True] == keys[False]


def _requirements(path: Path) -> list[str]:
    lines = (x.split("#")[0].strip() for x in path.read_text().splitlines())
    return [x for x in lines if x]


def test_the_repositorys_requirements_list_is_the_kits() -> None:
    """scripts/sglang-cpu carries the kit's list: the same requirements, where a kit is here."""
    ours = _requirements(ROOT / "scripts" / "sglang-cpu" / REQS)
    assert "sglang" not in ours and "torch" not in ours and "intel-openmp" in ours
    env = {k: v for k, v in os.environ.items() if k != "DRAFTDATA_CPUINFO"}
    res = _run(ROOT / "scripts" / "sglang_kit.sh", env=env)
    kit = Path(res.stdout.strip()) if res.returncode == 0 else None
    if kit is None or kit == ROOT / "scripts" / "sglang-cpu":
        pytest.skip("no SGLang CPU kit used on this machine to compare with")
    assert ours == _requirements(kit / REQS)
