"""The ``--ray`` options of ``generate``, ``tokenize`` and ``hidden-states``, and what they call.

The generate, tokenize and hidden-states commands (``cli/generate.py``, ``cli/tokenize.py``,
``cli/hidden_states.py``) add these annotated parameters to their signatures and, when
``--ray`` is given, hand their finished config to ``generate_on_ray`` / ``tokenize_on_ray`` /
``hidden_on_ray``, which print the summary and return the exit code. Help texts live here so
the commands describe Ray the same way. It is part of the CLI
(it parses options and prints); ``draftdata.distributed`` below it runs the job. Importing this
module imports Typer only (``draftdata --help`` stays instant); Ray is imported when a run
starts, and a missing Ray is a one-line error saying how to install it.
"""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from draftdata.generate.config import GenerateConfig
    from draftdata.hidden.config import HiddenConfig
    from draftdata.tokenize.config import TokenizeConfig

PANEL = "Ray cluster (multi-node)"

RayFlag = Annotated[
    bool,
    typer.Option(
        "--ray",
        # "\\[" is a literal "[" in rich markup (Typer renders help with rich).
        help="Run on a Ray cluster (generate: id-hash partitions, one engine per fleet node, "
        "all writing into the one --out run; tokenize: a Ray Data job over the completion "
        "shards; hidden-states: id-hash partitions, one task per GPU or fleet node, into the "
        "one --out set). Needs pip install 'draftdata\\[ray]'.",
        rich_help_panel=PANEL,
    ),
]
RayAddress = Annotated[
    str | None,
    typer.Option(
        "--ray-address",
        metavar="ADDRESS",
        help="Ray cluster to join: auto, HOST:6379 or ray://HOST:10001 (default: $RAY_ADDRESS, "
        "else the cluster started on this machine, else a new local Ray).",
        rich_help_panel=PANEL,
    ),
]
Partitions = Annotated[
    int | None,
    typer.Option(
        "--partitions",
        metavar="P",
        min=1,
        help="Number of id-hash partitions: with --ray, one Ray task each (default: generate 4 "
        "per fleet node, hidden-states 2 per worker; any value resumes any earlier run, since "
        "the done-set is shared); without, the P of --partition I.",
        rich_help_panel=PANEL,
    ),
]
OnlyPartitions = Annotated[
    str | None,
    typer.Option(
        "--only-partitions",
        metavar="I,J,...",
        help="Old spelling of --partition I,J,... with --ray.",
        hidden=True,
        rich_help_panel=PANEL,
    ),
]
FleetPerNode = Annotated[
    str | None,
    typer.Option(
        "--fleet-per-node",
        metavar="TEMPLATE",
        help="Each node's fleet.yaml, resolved on that node: {node} (hostname), {ip} and "
        "{node_id} are filled in, e.g. /shared/fleets/fleet-{node}.yaml. Without it, --fleet "
        "and --endpoint are read on each node (http://127.0.0.1:30000 is that node's server).",
        rich_help_panel=PANEL,
    ),
]
TasksPerNode = Annotated[
    int,
    typer.Option(
        "--tasks-per-node",
        min=1,
        help="Partitions one node runs at the same time (each is one engine over the whole "
        "local fleet, so 1 is right unless the engine is CPU-bound).",
        rich_help_panel=PANEL,
    ),
]
RayEnv = Annotated[
    list[str] | None,
    typer.Option(
        "--ray-env",
        metavar="VAR",
        help="Environment variable to forward from here to the Ray workers (repeatable; "
        "AWS_ENDPOINT_URL/AWS_REGION/AWS_PROFILE travel by default, secrets only when named).",
        rich_help_panel=PANEL,
    ),
]

RayTasks = Annotated[
    int | None,
    typer.Option(
        "--ray-tasks",
        min=1,
        help="tokenize --ray: shards tokenized at the same time across the cluster (default: "
        "as many as the cluster's CPUs allow, one CPU each).",
        rich_help_panel=PANEL,
    ),
]


def parse_only(value: str | None) -> list[int] | None:
    """``"1,3"`` -> [1, 3]; None stays None (ConfigError on anything else)."""
    from draftdata.errors import ConfigError

    if value is None or not value.strip():
        return None
    try:
        return [int(x) for x in value.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--partition: {value!r}; use indexes like 0,3,5") from None


def resolve_partitions(
    partition: str | None, partitions: int | None, only_partitions: str | None, *, ray: bool
) -> tuple[str | None, int | None, str | None]:
    """The one spelling ``--partition I[,J...]`` + ``--partitions P`` (``--partition I/P`` and
    ``--only-partitions I,J`` still accepted) -> (the one process's ``I/P`` or None, the Ray
    partition count or None, the Ray partitions to run ``"I,J"`` or None). ConfigError naming
    the option on anything that does not fit the mode."""
    from draftdata.errors import ConfigError

    if only_partitions is not None:
        if partition is not None:
            raise ConfigError("--only-partitions is the old spelling of --partition; give one")
        partition = only_partitions
    if partition is None:
        if partitions is not None and not ray:
            raise ConfigError(
                f"--partitions {partitions} without --ray: also say which one, --partition I"
            )
        return None, partitions if ray else None, None
    text = partition.strip()
    index, sep, count = text.partition("/")
    if sep:  # I/P names the count too
        if partitions is not None and count.strip() != str(partitions):
            raise ConfigError(
                f"--partition {partition} and --partitions {partitions} disagree; give one count"
            )
        if not ray:
            return text, None, None
        try:
            n = int(count)
        except ValueError:
            raise ConfigError(f"--partition: {partition!r}; use I/P, e.g. 0/4") from None
        return None, n, index
    if ray:
        return None, partitions, text
    if "," in text:
        raise ConfigError(
            f"--partition {partition}: one process runs one partition; use --ray to run "
            "several, or one command per partition"
        )
    if partitions is None:
        raise ConfigError(f"--partition {partition}: say how many with --partitions P (or I/P)")
    return f"{text}/{partitions}", None, None


def generate_on_ray(
    config: GenerateConfig,
    *,
    address: str | None = None,
    partitions: int | None = None,
    only: str | None = None,
    fleet_per_node: str | None = None,
    tasks_per_node: int = 1,
    forward_env: list[str] | None = None,
) -> int:
    """Run ``config`` on Ray, print the summary to stdout and return the exit code: 1 when a
    partition did not finish, else 0; interrupted, it ends as the single-process command does
    (Interrupted: the command line's line, 128 + the signal)."""
    from draftdata.distributed.cluster import require_ray

    require_ray()  # first, so a missing Ray is the one line the user sees
    from draftdata.distributed.ray_generate import RayOptions, run, summary_lines

    opts = RayOptions(
        address=address,
        partitions=partitions,
        only=parse_only(only),
        fleet_per_node=fleet_per_node,
        tasks_per_node=tasks_per_node,
        forward_env=list(forward_env or []),
    )
    result = run(config, opts)
    for line in summary_lines(result):
        typer.echo(line)
    if result.interrupted:  # the command line's line, 128 + the signal
        from draftdata.errors import Interrupted

        raise Interrupted(result.signal or signal.SIGINT)
    return 1 if result.failed_partitions else 0


def tokenize_on_ray(
    config: TokenizeConfig,
    *,
    address: str | None = None,
    concurrency: int | None = None,
    forward_env: list[str] | None = None,
) -> int:
    """Run tokenize ``config`` as a Ray Data job, print the summary (the single-process
    command's table and lines) and return the exit code."""
    from draftdata.distributed.cluster import require_ray

    require_ray()
    from draftdata.distributed.ray_tokenize import RayTokenizeOptions, run, summary_lines
    from draftdata.tokenize.summary import print_summary

    opts = RayTokenizeOptions(
        address=address, concurrency=concurrency, forward_env=list(forward_env or [])
    )
    result = run(config, opts)
    for line in summary_lines(result):
        typer.echo(line)
    print_summary(result.summary)
    return 0


def hidden_on_ray(
    config: HiddenConfig,
    *,
    address: str | None = None,
    partitions: int | None = None,
    only: str | None = None,
    fleet_per_node: str | None = None,
    tasks_per_node: int = 1,
    forward_env: list[str] | None = None,
) -> int:
    """Run hidden-states ``config`` over Ray (id-hash partitions, one task per GPU or per fleet
    node), print the summary and return the exit code: 1 when a partition
    did not finish, else 0. ``--gpus`` picks the workers: ``auto`` one GPU each, ``cpu`` CPU
    workers."""
    from draftdata.distributed.cluster import require_ray
    from draftdata.errors import ConfigError

    require_ray()
    from draftdata.distributed.ray_hidden import RayHiddenOptions, run, summary_lines

    gpus = config.gpus.strip().lower()
    if config.engine != "vllm" and gpus not in ("auto", "cpu"):
        raise ConfigError(
            f"--gpus {config.gpus} with --ray: each task takes the GPU Ray gives it; use "
            "--gpus auto (one task per GPU of the cluster) or cpu (CPU workers)"
        )
    opts = RayHiddenOptions(
        address=address,
        partitions=partitions,
        only=parse_only(only),
        gpus_per_task=0.0 if gpus == "cpu" or config.engine == "vllm" else 1.0,
        fleet_per_node=fleet_per_node,
        tasks_per_node=tasks_per_node,
        forward_env=list(forward_env or []),
    )
    result = run(config, opts)
    for line in summary_lines(result):
        typer.echo(line)
    if result.interrupted:  # the command line's line, 128 + the signal
        from draftdata.errors import Interrupted

        raise Interrupted(result.signal or signal.SIGINT)
    return 1 if result.failed_partitions else 0
