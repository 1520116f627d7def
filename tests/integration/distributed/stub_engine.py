"""A minimal sequential generate engine over the simulator, for the Ray plumbing tests.

It honours what ``generate --ray`` hands a partition (``partition``, ``writer_id``, the
node's endpoints, ``limit``) and commits through the real run store, so the Ray tests check
partitioning, placement, retries and exactly-once without depending on the full engine; the
same tests also run against the real engine (``draftdata.generate.stage``) when it is there.
Ray workers import it as ``tests.integration.distributed.stub_engine`` (PYTHONPATH = repo root).
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import msgspec

from draftdata.distributed.partition import parse_partition
from draftdata.fleet.spec import read_fleet
from draftdata.generate.config import GenerateConfig
from draftdata.records import Completion, Turn, Usage, iter_prompt_lines, parse_prompt
from draftdata.store.run import Run


def generate(
    config: GenerateConfig, partition: str | None = None, writer_id: str | None = None
) -> dict[str, Any]:
    """Answer every prompt of ``partition`` that the run has not committed, one at a time
    (``partition`` and ``writer_id`` default to the config's fields)."""
    partition = partition or config.partition
    writer_id = writer_id or config.writer_id
    part = parse_partition(partition) if partition else None
    settings = {"prompts": str(Path(config.prompts).resolve()), "max_tokens": config.max_tokens}
    urls = config.endpoints or [e.url for e in read_fleet(str(config.fleet)).endpoints]
    run = Run.open(
        config.out,
        settings=settings,
        writer_id=writer_id,
        flush_records=config.flush_records,
        flush_seconds=config.flush_seconds,
    )
    done = 0
    with run:
        for n, (lineno, raw) in enumerate(iter_prompt_lines(Path(config.prompts))):
            if config.limit is not None and n >= config.limit:
                break
            prompt = parse_prompt(raw, f"{config.prompts}:{lineno}")
            if (part and not part.contains(prompt.id)) or run.is_done(prompt.id):
                continue
            url = urls[n % len(urls)].rstrip("/")
            body = {
                "model": None,
                "messages": msgspec.to_builtins(prompt.messages),
                "max_tokens": config.max_tokens,
            }
            request = urllib.request.Request(
                f"{url}/v1/chat/completions",
                data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            started = time.monotonic()
            with urllib.request.urlopen(request, timeout=60) as resp:
                answer = json.loads(resp.read())
            choice = answer["choices"][0]
            usage = Usage(completion_tokens=int(answer["usage"]["completion_tokens"]))
            turn = Turn(
                content=choice["message"].get("content"),
                reasoning=choice["message"].get("reasoning_content"),
                finish_reason=choice.get("finish_reason"),
                usage=usage,
            )
            run.add_completion(
                Completion(
                    id=prompt.id,
                    source=prompt.source,
                    domain=prompt.domain,
                    messages=prompt.messages,
                    turns=[turn],
                    usage=usage,
                    endpoint=url,
                    latency_s=time.monotonic() - started,
                )
            )
            done += 1
            if run.flush_due():
                run.flush()
    return {"completed": done, "resumed": run.resumed_done}
