"""moto's IAM checks, switched on for a while: real refusals (AccessDenied, InvalidAccessKeyId,
SignatureDoesNotMatch) from the session's moto server, for users a test makes."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

ADMIN = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}],
}
ALLOW_ALL = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Allow", "Action": ["s3:*"], "Resource": "*"}],
}
DENY_PUT = {
    "Version": "2012-10-17",
    "Statement": [{"Effect": "Deny", "Action": ["s3:PutObject"], "Resource": "*"}],
}
# a policy that allows nothing the store does: every request of the user is denied
ALLOW_NOTHING = {
    "Version": "2012-10-17",
    "Statement": [
        {"Effect": "Allow", "Action": ["s3:GetBucketTagging"], "Resource": "arn:aws:s3:::other"}
    ],
}


@contextmanager
def iam_enforced(endpoint: str) -> Iterator[None]:
    """moto checks signatures and IAM policies on every request while inside (its own
    switch, ``/moto-api/reset-auth``); the session's server is open again after."""

    def post(count: str) -> None:
        req = urllib.request.Request(
            f"{endpoint}/moto-api/reset-auth",
            data=count.encode(),
            headers={"Content-Type": "application/octet-stream"},  # a form's body is parsed
        )
        urllib.request.urlopen(req, timeout=10).read()

    post("0")
    try:
        yield
    finally:
        post("inf")


def iam(endpoint: str, keys: tuple[str, str] | None = None) -> Any:
    """An IAM client of the moto server: the environment's keys (while the checks are off)
    or a user's ``keys`` (an ADMIN's, while they are on)."""
    import boto3

    if keys is None:
        return boto3.client("iam", endpoint_url=endpoint)
    return boto3.client(
        "iam", endpoint_url=endpoint, aws_access_key_id=keys[0], aws_secret_access_key=keys[1]
    )


def make_user(endpoint: str, name: str, policy: dict[str, Any]) -> tuple[str, str]:
    """A new IAM user with ``policy`` inline: its (access key id, secret)."""
    client = iam(endpoint)
    client.create_user(UserName=name)
    client.put_user_policy(UserName=name, PolicyName="p", PolicyDocument=json.dumps(policy))
    key = client.create_access_key(UserName=name)["AccessKey"]
    return key["AccessKeyId"], key["SecretAccessKey"]
