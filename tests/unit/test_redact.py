"""The redaction at the edge where endpoint URLs and server text enter (issue 24)."""

from __future__ import annotations

import base64
import string

from hypothesis import given, settings
from hypothesis import strategies as st

from draftdata.support.redact import MASK, Redactor, redact_url, url_secrets

_SECRET = st.text(alphabet=string.ascii_letters + string.digits + "-_.~", min_size=8, max_size=40)
_TEXT = st.text(max_size=200)


@settings(max_examples=300, deadline=None)
@given(key=_SECRET, password=_SECRET, before=_TEXT, after=_TEXT, form=st.integers(0, 4))
def test_a_planted_secret_never_survives_in_any_form(
    key: str, password: str, before: str, after: str, form: int
) -> None:
    url = f"http://alice:{password}@127.0.0.1:30000"
    basic = base64.b64encode(f"alice:{password}".encode()).decode()
    planted = [
        f"Authorization: Bearer {key}",
        f'{{"headers": {{"authorization": "Basic {basic}"}}}}',
        f"could not reach {url}/v1/chat/completions",
        f"api_key={key}",
        f"the key {key} and the password {password}",
    ][form]
    redact = Redactor.of(key, [url])
    clean = redact(before + planted + after)
    for secret in (key, password, basic):
        assert secret not in clean
    assert MASK in clean


@settings(max_examples=200, deadline=None)
@given(user=st.text(string.ascii_lowercase, min_size=1, max_size=8), password=_SECRET)
def test_a_url_is_shown_with_its_user_and_without_its_password(user: str, password: str) -> None:
    url = f"https://{user}:{password}@gpu-3.example:8443/v1"
    shown = redact_url(url)
    assert shown == f"https://{user}:{MASK}@gpu-3.example:8443/v1"
    assert password in url_secrets(url)
    assert redact_url("http://127.0.0.1:30000") == "http://127.0.0.1:30000"


def test_short_values_and_ordinary_words_are_left_alone() -> None:
    redact = Redactor(["ab", None, ""])
    assert redact("ab cd: the model said 'Bearer of bad news'") == (
        "ab cd: the model said 'Bearer of bad news'"
    )
    assert Redactor()("usage: 12 prompt tokens") == "usage: 12 prompt tokens"
