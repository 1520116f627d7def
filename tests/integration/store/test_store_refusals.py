"""What the S3 store makes of a refusal that waiting cannot cure, against moto's server with
its IAM checks on: every kind of refusal × every store operation is a StoreError that is no
outage (generate stops on it in one line) naming the object and the cause, and only an outage
(503, a connection refused) is one generate waits out.

The refusals are real where moto can make them: a policy that denies (AccessDenied), an
access key S3 does not know (InvalidAccessKeyId), a wrong secret (SignatureDoesNotMatch), no
credentials at all (botocore's NoCredentialsError). moto does not expire tokens, so an expired
session token is S3's own answer (400 ExpiredToken; a HEAD's without a body) from a proxy in
front of moto."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.conftest import MotoS3
from tests.integration.generate.s3_outage import S3Outage
from tests.integration.store.moto_iam import ALLOW_NOTHING, iam_enforced, make_user

from draftdata.errors import StoreAccessError, StoreError, TransientStoreError
from draftdata.store import open_store
from draftdata.store.base import Store
from draftdata.store.s3 import _clients

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def reader_keys(moto_s3: MotoS3) -> tuple[str, str]:
    """An IAM user whom the store's every request is denied: its (key id, secret)."""
    return make_user(moto_s3.endpoint_url, "outsider", ALLOW_NOTHING)


# the operation, and whether S3 answers it without a body (HEAD: no code, no message)
OPERATIONS: dict[str, tuple[Callable[[Store, Path], object], bool]] = {
    "put_new": (lambda s, f: s.put_new("new/x.bin", b"bytes"), False),
    "put_new_file": (lambda s, f: s.put_new_file("new/y.bin", f), False),
    "read": (lambda s, f: s.read("there.bin"), False),
    "read_range": (lambda s, f: s.read_range("there.bin", 1, 2), False),
    "list": (lambda s, f: s.list(), False),
    "exists": (lambda s, f: s.exists("there.bin"), True),
    "size": (lambda s, f: s.size("there.bin"), True),
    "open_input": (lambda s, f: s.open_input("there.bin").read(), True),
}
REFUSALS = ["denied", "unknown_key", "bad_secret", "no_credentials", "expired"]
OUTAGES = ["503", "unreachable"]


@settings(
    max_examples=24,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(kind=st.sampled_from(REFUSALS + OUTAGES), op=st.sampled_from(sorted(OPERATIONS)))
def test_a_refusal_is_no_outage_and_an_outage_is_one(
    moto_s3: MotoS3,
    reader_keys: tuple[str, str],
    tmp_path_factory: pytest.TempPathFactory,
    monkeypatch: pytest.MonkeyPatch,
    kind: str,
    op: str,
) -> None:
    url = moto_s3.url("refusal")
    store = open_store(url)
    store.put_new("there.bin", b"committed")  # committed work: still whole afterwards
    local = tmp_path_factory.mktemp("f") / "y.bin"
    local.write_bytes(b"file bytes")
    call, headless = OPERATIONS[op]
    key_id, secret = reader_keys
    with monkeypatch.context() as mp, S3Outage(moto_s3.endpoint_url) as proxy:
        mp.setenv("DRAFTDATA_S3_MAX_ATTEMPTS", "1")
        if kind == "denied":
            mp.setenv("AWS_ACCESS_KEY_ID", key_id)
            mp.setenv("AWS_SECRET_ACCESS_KEY", secret)
        elif kind == "unknown_key":
            mp.setenv("AWS_ACCESS_KEY_ID", "AKIANOTAKEYATALL1234")
        elif kind == "bad_secret":
            mp.setenv("AWS_ACCESS_KEY_ID", key_id)
            mp.setenv("AWS_SECRET_ACCESS_KEY", secret[::-1])
        elif kind == "no_credentials":
            empty = tmp_path_factory.mktemp("aws") / "none"
            empty.write_text("")
            for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"):
                mp.delenv(name, raising=False)
            mp.delenv("AWS_PROFILE", raising=False)
            mp.setenv("AWS_SHARED_CREDENTIALS_FILE", str(empty))
            mp.setenv("AWS_CONFIG_FILE", str(empty))
        elif kind == "expired":
            proxy.mode = "expired"
            mp.setenv("AWS_ENDPOINT_URL", proxy.url)
        elif kind == "503":
            proxy.mode = "503"
            mp.setenv("AWS_ENDPOINT_URL", proxy.url)
        else:  # unreachable: nothing listens there
            mp.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
        _clients.clear()  # credentials and endpoint are read when a client is made
        try:
            with iam_enforced(moto_s3.endpoint_url), pytest.raises(StoreError) as caught:
                call(store, local)
        finally:
            _clients.clear()
    err = caught.value
    text = str(err)
    assert "\n" not in text
    if kind in OUTAGES:
        assert isinstance(err, TransientStoreError) and err.outage, text
        return
    assert not err.outage, f"{kind} × {op} is waited out as an outage: {text}"
    assert url.split("/", 3)[3] in text  # it names the object or prefix
    if kind == "expired" and headless:
        # S3 gives a HEAD no reason: the line says which cause answers so
        assert "expired credentials" in text, text
    elif kind in ("denied", "unknown_key", "bad_secret") and headless:
        assert isinstance(err, StoreAccessError) and "access denied" in text, text
    else:
        assert isinstance(err, StoreAccessError), text
        cause = {
            "denied": "access denied",
            "unknown_key": "does not accept the AWS credentials",
            "bad_secret": "does not accept the AWS credentials",
            "no_credentials": "no usable AWS credentials",
            "expired": "have expired",
        }[kind]
        assert cause in text, text
    assert open_store(url).read("there.bin") == b"committed"
