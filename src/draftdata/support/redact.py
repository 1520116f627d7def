"""Secrets out of everything draftdata shows or stores: URL passwords, API keys, auth headers.

Secrets enter a run at two edges: endpoint URLs (``http://user:PASSWORD@host``, from
``--endpoint`` or fleet.yaml) and server text (a gateway that echoes the ``Authorization``
header in an error body). ``redact_url`` is the form of a URL that may be shown or recorded
(the password replaced by ``***``, the user kept so two accounts stay apart); a ``Redactor``
replaces known secrets (the API key, each URL's password, in plain, percent-decoded and
HTTP basic-auth form) and any ``Bearer``/``Basic`` credential or URL password in a text. The
generate client passes every server text and error message through one before it becomes a
log line, a Failure message or an exception.

This module does no I/O and knows nothing of the pipeline; it never logs what it removes.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable
from urllib.parse import unquote, urlsplit, urlunsplit

MASK = "***"
_MIN_SECRET = 4  # shorter values would mask ordinary words ("a", "dev")
# a credential after an auth scheme (an echoed Authorization header) or a key-like field name
_AUTH_VALUE = re.compile(
    r"(?i)(\b(?:bearer|basic)\s+|\b(?:x-)?api[-_]?key[\"']?\s*[:=]\s*[\"']?)"
    r"[A-Za-z0-9._~+/=-]{6,}"
)
# the password of any URL in a text: scheme://user:password@
_URL_PASSWORD = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://[^\s/:@\"'<>]*):[^\s/@\"'<>]*@")


def redact_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``: the form to show and record."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return _URL_PASSWORD.sub(rf"\1:{MASK}@", url)
    if parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    user = parts.netloc.rpartition("@")[0].partition(":")[0]
    return urlunsplit(parts._replace(netloc=f"{user}:{MASK}@{host}"))


def url_secrets(url: str) -> list[str]:
    """The secret forms of ``url``'s credentials: the password as written and percent-decoded,
    and the ``user:password`` pair as an HTTP basic-auth header carries it (base64)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    if parts.password is None:
        return []
    raw_user, _, raw_password = parts.netloc.rpartition("@")[0].partition(":")
    user, password = unquote(raw_user), unquote(raw_password)
    pair = base64.b64encode(f"{user}:{password}".encode()).decode()
    return [raw_password, password, pair, pair.rstrip("=")]


class Redactor:
    """Replaces known secrets and anything shaped like a credential in a text with ``***``."""

    def __init__(self, secrets: Iterable[str | None] = ()) -> None:
        known = {s for s in secrets if s and len(s) >= _MIN_SECRET}
        # longest first: a secret containing another is masked whole
        self._secrets = sorted(known, key=len, reverse=True)

    @classmethod
    def of(cls, api_key: str | None, urls: Iterable[str] = ()) -> Redactor:
        """The redactor of an API key and the credentials of ``urls``."""
        secrets: list[str | None] = [api_key]
        for url in urls:
            secrets.extend(url_secrets(url))
        return cls(secrets)

    def __call__(self, text: str) -> str:
        """``text`` without any known secret, credential value or URL password."""
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        text = _AUTH_VALUE.sub(rf"\1{MASK}", text)
        return _URL_PASSWORD.sub(rf"\1:{MASK}@", text)
