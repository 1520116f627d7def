"""Two Ray nodes on one machine, a fleet each: every node runs partitions on its own fleet.

Opt-in (DRAFTDATA_RAY_MULTINODE=1): three raylets cost about a minute on two cores, more than
the tier's budget. Runs in a subprocess, so it has a Ray instance of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tests.chaos.invariants import check_exactly_once

pytestmark = [
    pytest.mark.integration,
    pytest.mark.ray,
    pytest.mark.skipif(
        os.environ.get("DRAFTDATA_RAY_MULTINODE") != "1",
        reason="set DRAFTDATA_RAY_MULTINODE=1 (starts a 3-node Ray cluster, ~1 min)",
    ),
]


def test_each_node_serves_its_partitions_from_its_own_fleet(tmp_path: Path) -> None:
    pytest.importorskip("ray")
    driver = Path(__file__).with_name("multinode_driver.py")
    proc = subprocess.run(
        [sys.executable, str(driver), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["failed"] == [] and report["committed"] == 40
    assert all(n > 0 for n in report["served"])  # both fleets answered
    assert sum(report["served"]) == 40  # each prompt was sent once, to one node's fleet
    assert len(report["nodes"]) == 2  # two labels (same hostname: host/<node id>)
    assert all(row["partitions"] >= 1 for row in report["nodes"].values())
    check_exactly_once(str(tmp_path / "run"), {f"m{i:03d}" for i in range(40)})
