"""generate's command line builds its config before Ray: with ``--fleet-per-node`` (each node
reads its own fleet file) and no ``--endpoint``/``--fleet``, the servers are checked on the
nodes, not refused on the head ("give at least one server" broke the Ray run on S3)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from draftdata.cli.generate import GenerateOptions, _build_config
from draftdata.errors import ConfigError


@settings(max_examples=30, deadline=None)
@given(
    per_node=st.booleans(),
    endpoint=st.booleans(),
    fleet=st.booleans(),
)
def test_servers_are_checked_where_they_are_known(
    per_node: bool, endpoint: bool, fleet: bool
) -> None:
    opts = GenerateOptions(
        prompts="p.jsonl",
        out="run/",
        endpoints=["http://127.0.0.1:1"] if endpoint else None,
        fleet="fleet.yaml" if fleet else None,
        fleet_per_node="/shared/fleet-{node}.yaml" if per_node else None,
    )
    if endpoint and fleet:
        with pytest.raises(ConfigError, match="give one or the other"):
            _build_config(opts, partition=None)
    elif not (endpoint or fleet or per_node):
        with pytest.raises(ConfigError, match="give at least one server"):
            _build_config(opts, partition=None)
    else:
        cfg = _build_config(opts, partition=None)
        assert cfg.fleet == ("fleet.yaml" if fleet else None)  # the template is no fleet file
        assert bool(cfg.endpoints) == endpoint
        assert Path(cfg.prompts).name == "p.jsonl"
