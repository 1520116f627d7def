"""Two Ray "nodes" on this machine (``ray.cluster_utils.Cluster``), a simulated fleet each.

Usage: python multinode_driver.py WORKDIR. Runs ``generate --ray`` over 40 prompts with
``--fleet-per-node WORKDIR/fleet-{node_id}.yaml`` and prints one JSON line: the served
count of each node's fleet and the run's per-node summary. Run by test_ray_multinode.py in a
subprocess, so it has a Ray of its own.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(workdir: Path) -> None:
    """Start the cluster, run, print the JSON line, stop everything."""
    import ray
    from ray.cluster_utils import Cluster

    from draftdata.distributed.ray_generate import RayOptions, run
    from draftdata.generate.config import GenerateConfig
    from draftdata.sim.run import SimConfig, SimFleet

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    for _ in range(2):
        cluster.add_node(num_cpus=1, resources={"draftdata_fleet": 1})
    ray.init(address=cluster.address, include_dashboard=False, log_to_driver=False)
    try:
        cluster.wait_for_nodes()
        prompts = workdir / "prompts.jsonl"
        prompts.write_text(
            "".join(
                json.dumps({"id": f"m{i:03d}", "messages": [{"role": "user", "content": f"{i}"}]})
                + "\n"
                for i in range(40)
            )
        )
        sim = SimConfig(mean_output_tokens=24, min_output_tokens=8, time_scale=0.3)
        with SimFleet(1, sim) as a, SimFleet(1, sim) as b:
            marked = [n["NodeID"] for n in ray.nodes() if n["Resources"].get("draftdata_fleet")]
            a.write(workdir / f"fleet-{marked[0]}.yaml")
            b.write(workdir / f"fleet-{marked[1]}.yaml")
            config = GenerateConfig(
                prompts=str(prompts),
                out=str(workdir / "run"),
                max_tokens=64,
                concurrency=2,
                hedge=False,  # one request per prompt, so the servers' counts add up
                progress="off",
            )
            opts = RayOptions(
                partitions=4, fleet_per_node=str(workdir / "fleet-{node_id}.yaml"), report_s=0.5
            )
            result = run(config, opts, log=lambda line: None)
            served = [a.stats(0).served, b.stats(0).served]
        print(
            json.dumps(
                {
                    "served": served,
                    "nodes": result.nodes,
                    "failed": result.failed_partitions,
                    "committed": result.committed,
                }
            )
        )
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
