"""`--token-ids on` against a server that cannot return ids fails early, in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.integration.generate.helpers import completions, write_prompts

from draftdata.cli import main
from draftdata.sim.run import SimConfig, SimFleet

pytestmark = pytest.mark.integration


def test_token_ids_on_refuses_a_server_without_ids_before_the_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, 20)
    config = SimConfig(time_scale=0.0, mean_output_tokens=20, token_ids=False)
    with (
        SimFleet(2, SimConfig(time_scale=0.0, mean_output_tokens=20)) as good,
        SimFleet(1, config) as bad,
    ):
        base = ["generate", "-p", str(prompts), "--progress", "off", "--max-tokens", "64"]
        urls = ["-e", good.urls[0], "-e", bad.urls[0], "-e", good.urls[1]]
        with pytest.raises(SystemExit) as info:
            main([*base, *urls, "-o", str(tmp_path / "on"), "--token-ids", "on"])
        err = capsys.readouterr().err
        assert info.value.code == 1, err
        (line,) = [ln for ln in err.splitlines() if ln.startswith("error:")]
        assert f"--token-ids on: {bad.urls[0]} does not return token ids" in line
        assert not (tmp_path / "on").exists()  # refused before the run was opened
        assert bad.stats(0).requests == 1  # one probe request, no prompt sent
        # auto: the same fleet works, with ids where a server returns them
        with pytest.raises(SystemExit) as info:
            main([*base, *urls, "-o", str(tmp_path / "auto"), "--token-ids", "auto"])
        assert info.value.code in (0, None), capsys.readouterr().err
    got = completions(tmp_path / "auto")
    assert len(got) == 20
    with_ids = {c.endpoint for c in got if c.turns[0].output_token_ids}
    assert bad.urls[0] not in with_ids and with_ids <= set(good.urls)
