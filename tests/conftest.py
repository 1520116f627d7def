"""Shared fixtures for the whole suite."""

import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, settings

# A loaded machine (other jobs, xdist workers side by side) must not fail a property on time:
# no per-example deadline and no "data generation too slow" health check in the whole suite.
# The properties' verdicts are about values; a test about speed says so with its own bound.
settings.register_profile("draftdata", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile("draftdata")


def pytest_configure(config: pytest.Config) -> None:
    """How the suite is started decides no verdict.

    Started from a background job of a non-interactive shell (``make test &`` in a script,
    CI runners), the suite inherits SIGINT ignored, and so would every child it starts: the
    tests that press Ctrl-C on a child would then test nothing. Restore Python's own handler
    here; an exec'd child gets the default disposition back (a handler is not inherited, an
    ignored signal is)."""
    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    # Nor may the width of the shell that started the suite decide a verdict: $COLUMNS (which
    # pytest-xdist sets to 80 in its workers) narrows the CLI's tables until a title wraps.
    # Tests that are about a width set it themselves.
    for name in ("COLUMNS", "LINES"):
        os.environ.pop(name, None)


# Folders whose tests share one costly session fixture: under pytest-xdist's --dist loadscope
# each is dealt to one worker whole, instead of module by module (a Ray instance per worker costs
# ~15 s and a GB or two of memory).
ONE_WORKER = ("tests/integration/distributed/",)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    """--dist loadscope, with each folder of ONE_WORKER one scope (other modes: xdist's own)."""
    if config.getoption("dist", None) != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FolderScopes(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            for folder in ONE_WORKER:
                if nodeid.startswith(folder):
                    return folder
            return str(super()._split_scope(nodeid))

    return FolderScopes(config, log)


@dataclass(frozen=True)
class MotoS3:
    """A running moto S3 server: ``endpoint_url``, a created ``bucket``, and ``url(name)``."""

    endpoint_url: str
    bucket: str

    def url(self, name: str) -> str:
        """A fresh ``s3://bucket/<name>-<random>`` prefix, so tests never share objects."""
        import secrets

        return f"s3://{self.bucket}/{name}-{secrets.token_hex(4)}"

    def client(self) -> object:
        """A boto3 S3 client pointed at the server (the oracle view of the bucket)."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint_url)


@pytest.fixture(scope="session")
def moto_s3() -> Iterator[MotoS3]:
    """Session-scoped moto S3 server on 127.0.0.1 (ephemeral port) with one created bucket.

    Use it in any stage's test that needs real S3 semantics (conditional PUT 412, ranged GETs)::

        def test_x(moto_s3):
            url = moto_s3.url("mytest")          # s3://draftdata-test/mytest-1a2b3c4d
            ...                                  # open_store(url), Run.open(url, ...), a CLI

    While it is active, AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and
    AWS_DEFAULT_REGION point every client at it (subprocesses inherit them). Each test should
    take its own prefix with ``moto_s3.url(name)``; the bucket is shared by the session.
    """
    pytest.importorskip("moto")
    import boto3
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AWS_ACCESS_KEY_ID", "testing")
        mp.setenv("AWS_SECRET_ACCESS_KEY", "testing")
        mp.setenv("AWS_DEFAULT_REGION", "us-east-1")
        mp.setenv("AWS_ENDPOINT_URL", endpoint)
        mp.setenv("AWS_EC2_METADATA_DISABLED", "true")
        bucket = "draftdata-test"
        boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket=bucket)
        try:
            yield MotoS3(endpoint_url=endpoint, bucket=bucket)
        finally:
            server.stop()
