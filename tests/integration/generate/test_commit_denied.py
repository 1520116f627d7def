"""A store that refuses generate's commits for good, under a real `draftdata generate` on S3
(moto's server with its IAM checks on): the command stops in one line naming the cause instead
of waiting for the store for ever, what it committed is kept, and once the cause is fixed the
same command finishes the run exactly once.

The refusals, each met after the first shard is committed: the writer's policy is changed to
deny PutObject (AccessDenied), its access key is deleted (InvalidAccessKeyId), its session
token expires (S3's 400 ExpiredToken from a proxy: moto expires nothing). And a manifest met
while committing that is not JSON (an object put at the run's ``manifest.json`` between
generate's start and its first commit)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, example, given, settings
from hypothesis import strategies as st
from tests.chaos.invariants import check_exactly_once
from tests.conftest import MotoS3
from tests.integration.generate.helpers import write_prompts
from tests.integration.generate.s3_outage import S3Outage
from tests.integration.store.moto_iam import (
    ADMIN,
    ALLOW_ALL,
    DENY_PUT,
    iam,
    iam_enforced,
    make_user,
)

from draftdata.sim.run import SimConfig, SimFleet

pytestmark = [pytest.mark.integration, pytest.mark.chaos]

CLI = [sys.executable, "-c", "from draftdata.cli import main; main()", "generate"]
STOPS_WITHIN = 60.0  # seconds; the old committer waited for the store for ever


def _shards(client: Any, bucket: str, out: str) -> int:
    prefix = out.split("/", 3)[3] + "/completions/"
    return int(client.list_objects_v2(Bucket=bucket, Prefix=prefix).get("KeyCount", 0))


def _client(endpoint: str, keys: tuple[str, str]) -> Any:
    import boto3

    return boto3.client(
        "s3", endpoint_url=endpoint, aws_access_key_id=keys[0], aws_secret_access_key=keys[1]
    )


_users = iter(range(10**6))


@settings(
    max_examples=2,
    deadline=None,
    phases=[Phase.explicit, Phase.reuse, Phase.generate],
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    kind=st.sampled_from(["denied", "key_deleted", "expired", "manifest"]),
    flush_records=st.integers(4, 24),
)
@example(kind="denied", flush_records=8)
@example(kind="key_deleted", flush_records=8)
@example(kind="expired", flush_records=8)
@example(kind="manifest", flush_records=8)
def test_a_store_refusal_stops_generate_in_one_line_and_keeps_the_committed(
    tmp_path_factory: pytest.TempPathFactory, moto_s3: MotoS3, kind: str, flush_records: int
) -> None:
    root = tmp_path_factory.mktemp("denied")
    prompts = root / "p.jsonl"
    ids = write_prompts(prompts, 160)
    out = moto_s3.url(f"denied-{kind}")
    endpoint = moto_s3.endpoint_url
    user = f"writer{next(_users)}"
    writer = make_user(endpoint, user, ALLOW_ALL)
    admin = make_user(endpoint, f"admin{next(_users)}", ADMIN)  # the test's own view
    config = SimConfig(time_scale=0.2, mean_output_tokens=50, output_sigma=0.3, max_running=8)
    errs = root / "err.txt"
    with SimFleet(1, config) as fleet, S3Outage(endpoint) as proxy:
        cmd = [*CLI, "--prompts", str(prompts), "--out", out, "--progress", "off"]
        cmd += ["--endpoint", fleet.urls[0], "--flush-records", str(flush_records)]
        cmd += ["--flush-seconds", "0.3" if kind != "manifest" else "3"]

        def env(keys: tuple[str, str]) -> dict[str, str]:
            return {
                **os.environ,
                "AWS_ACCESS_KEY_ID": keys[0],
                "AWS_SECRET_ACCESS_KEY": keys[1],
                "AWS_ENDPOINT_URL": proxy.url,
                "DRAFTDATA_S3_MAX_ATTEMPTS": "1",
            }

        view = _client(endpoint, admin)
        with iam_enforced(endpoint):
            began = time.monotonic()
            with errs.open("w") as err:
                proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=err, env=env(writer))
                try:
                    deadline = time.monotonic() + 60
                    if kind == "manifest":  # before the first commit, after the run is opened
                        while fleet.stats(0).served == 0:
                            assert proc.poll() is None, errs.read_text()
                            assert time.monotonic() < deadline, errs.read_text()
                            time.sleep(0.02)
                        view.put_object(
                            Bucket=moto_s3.bucket,
                            Key=out.split("/", 3)[3] + "/manifest.json",
                            Body=b"<html>not a manifest</html>",
                        )
                    else:
                        while _shards(view, moto_s3.bucket, out) == 0:
                            assert proc.poll() is None, errs.read_text()
                            assert time.monotonic() < deadline, errs.read_text()
                            time.sleep(0.02)
                        if kind == "denied":
                            iam(endpoint, admin).put_user_policy(
                                UserName=user,
                                PolicyName="deny",
                                PolicyDocument=json.dumps(DENY_PUT),
                            )
                        elif kind == "key_deleted":
                            iam(endpoint, admin).delete_access_key(
                                UserName=user, AccessKeyId=writer[0]
                            )
                        else:
                            proxy.mode = "expired"
                    code = proc.wait(timeout=STOPS_WITHIN)
                except subprocess.TimeoutExpired:
                    pytest.fail(f"{kind}: waited for the store: {errs.read_text()[-2000:]}")
                finally:
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait()
            took = time.monotonic() - began
            stderr = errs.read_text()
            assert code == 1, stderr[-3000:]
            assert "Traceback" not in stderr
            lines = [line for line in stderr.splitlines() if line.startswith("error:")]
            assert len(lines) == 1, stderr
            # the lease's HEAD may meet it first: S3 gives a HEAD's 403 or 400 no reason
            causes = {
                "denied": ["access denied"],
                "key_deleted": ["does not accept the AWS credentials", "access denied"],
                "expired": ["credentials have expired", "expired credentials"],
                "manifest": ["manifest.json: not valid JSON"],
            }[kind]
            assert any(cause in lines[0] for cause in causes), stderr
            assert "retried with backoff" not in stderr, stderr
            assert "waiting for the store" not in stderr, stderr
            if kind == "manifest":
                return
            committed = _shards(view, moto_s3.bucket, out)
            assert committed > 0
            # the cause fixed, the same command finishes the run
            proxy.mode = "ok"
            keys = writer
            if kind == "denied":
                iam(endpoint, admin).delete_user_policy(UserName=user, PolicyName="deny")
            elif kind == "key_deleted":
                got = iam(endpoint, admin).create_access_key(UserName=user)["AccessKey"]
                keys = (got["AccessKeyId"], got["SecretAccessKey"])
            again = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env(keys))
            assert again.returncode == 0, again.stderr[-3000:]
    print(f"{kind}: stopped after {took:.1f} s with {committed} shards committed")
    assert check_exactly_once(out, set(ids)) == (160, 0)
