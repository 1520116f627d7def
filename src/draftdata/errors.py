"""The one exception tree of draftdata.

    DraftdataError                      a user-facing problem: the CLI prints one line, exit 1
    ├── ConfigError                     bad YAML, unknown key, wrong type, bad option value
    ├── InputError                      unreadable input file, malformed record (located)
    │   ├── RowError                    one row rejected (``reason`` code, ``detail``: where
    │   │                               and what); counted and written to a rejects file
    │   └── EmptyInputError             an input that holds nothing (an empty file, blank
    │                                   text, ``[ ]``, gzip of these, a parquet of 0 rows):
    │                                   every command refuses it in the same line
    ├── FormatVersionError              a file written by an incompatible draftdata
    ├── StoreError                      the run store refused or failed (``outage``: waiting
    │   │                               can cure it; generate waits out only those (+); any
    │   │                               other stops the command in one line, committed work
    │   │                               kept)
    │   ├── TransientStoreError         throttling, 5xx, timeouts, connection errors (+)
    │   ├── LeaseUnconfirmedError       the run lease could not be renewed: no answer (+)
    │   ├── DiskError                   a local file: the disk is full or over quota (+:
    │   │   │                           space can be freed while it waits)
    │   │   └── ReadOnlyDiskError       ... or the file system is read-only (no waiting)
    │   ├── StoreAccessError            access denied (a policy, a file's mode), credentials
    │   │                               missing, invalid or expired
    │   ├── AlreadyExistsError          a create-only write found the key already there
    │   ├── ProtectedPrefixError        the output overlaps a protected prefix
    │   ├── RunMismatchError            the run's manifest disagrees with this config
    │   └── UnreadableObjectError       an object of the run is not what its format says
    │       │                           (a manifest that is not a JSON object)
    │       └── UnreadableShardError    a run's shard cannot be read: set it aside
    ├── RunLeaseError                   the run lease (one writer per run, store/lease.py)
    │   ├── LeaseHeldError              another live process writes this run
    │   └── LeaseLostError              another process took over: stop committing
    ├── FleetError                      no endpoint reachable, a server failed to start
    │   └── FleetUnavailableError       no endpoint could serve for a bounded time, every
    │                                   endpoint refuses chat requests, or one 400 ends most
    │                                   of the first requests (generate stops, resumable)
    ├── RunAbortedError                 an unexpected error stopped a run (committed work kept)
    ├── WorkerDiedError                 a worker process of tokenize, merge or hidden-states
    │                                   died (killed by the out-of-memory killer, a crash);
    │                                   the line says how (``support/workerpool.py``)
    ├── VerificationError               hidden states written differ from the same samples
    │                                   computed one at a time beyond the dtype's tolerance
    ├── RefusedRequestError             the simulator refuses a chat request (HTTP ``status``;
    │                                   ``sim/`` answers it as the engine's error body)
    └── ServerError                     one request failed; ``reason`` names it in Failures
        │                               and in the endpoints' error counts
        ├── RetryableServerError        server_error: a 5xx, an answer the server aborted
        │   ├── MalformedAnswerError    malformed: a body that is no chat completion
        │   ├── RateLimitedError        rate_limited: 429 (with the server's Retry-After)
        │   ├── RequestTimeoutError     timeout: no whole answer in time, or 408
        │   └── ConnectionLostError     connection: cannot connect, reset, cut short
        ├── EndpointFaultError          the endpoint's fault, never the prompt's (it is
        │   │                           taken out, the work moves on uncharged)
        │   ├── EndpointRefusedError    refused: 401/403/404/405/407/501 for chat
        │   └── ImpossibleAnswerError   impossible: over its size bound, impossible usage
        └── FatalRequestError           invalid_request: the request itself is bad (4xx)
            └── ContextLengthError      context_length: prompt (+ max tokens) exceeds the
                                        context

    Interrupted (a BaseException)      SIGINT/SIGTERM stopped a command (``workerpool.py``:
                                        ``interrupts``); exit 128 + signal

Retry decisions are made by type, never by matching message text; raw HTTP, S3 and file errors
are mapped to these types in one place per layer (``raise ... from exc``): an inference server's
answers in ``generate/engine/client.py``, which raises only the leaves above (and
``RetryableServerError`` itself), and the dispatcher catches them by type. Anything that is not
a DraftdataError is a bug and keeps its traceback.
"""

from __future__ import annotations

import contextlib
import errno
import signal
from collections.abc import Iterator
from typing import ClassVar


class DraftdataError(Exception):
    """A problem the user can fix; printed as one line by the CLI (exit code 1)."""

    def __reduce__(self) -> tuple[object, ...]:
        # as it is, not through ``__init__`` (a subclass's takes other arguments than
        # ``args``): a worker process's error reaches the command unchanged
        return _rebuilt, (type(self), self.args, dict(self.__dict__))


def _rebuilt(
    cls: type[BaseException], args: tuple[object, ...], state: dict[str, object]
) -> object:
    """An exception unpickled as it was pickled (``DraftdataError.__reduce__``)."""
    exc = cls.__new__(cls, *args)
    exc.__dict__.update(state)
    return exc


class ConfigError(DraftdataError):
    """An invalid configuration file, key, type or option value."""


class InputError(DraftdataError):
    """An input file that cannot be read, or a record that does not validate."""


class EmptyInputError(InputError):
    """An input that holds nothing to read: an empty file, only blank lines or white space, an
    empty JSON array (``[ ]``), gzip of these, or a parquet of 0 rows (every file of a folder
    so). ``draftdata.shared.readers.files.holds_nothing`` decides it for every command; the
    line is the same wherever it is refused."""

    SHAPES: ClassVar[str] = (
        "an empty file, only blank lines or white space, an empty JSON array, gzip of these, "
        "or a parquet of 0 rows"
    )

    def __init__(self, where: str, fix: str = "give one that holds rows") -> None:
        super().__init__(f"{where}: holds nothing to read ({self.SHAPES}); {fix}")
        self.where = where


class RowError(InputError):
    """One row rejected for ``reason`` (a reason code, e.g. prepare's ``bad_json``); ``detail``
    says where and what. Readers and adapters raise (or yield) it; the stage counts it under
    its reason and writes it to its rejects file, and goes on with the next row."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class FormatVersionError(DraftdataError):
    """A file carries a format version this draftdata cannot read."""


class StoreError(DraftdataError):
    """The run store refused an operation or failed to perform it.

    ``outage`` says whether waiting can cure it: True only for the store's passing conditions
    (TransientStoreError: throttling, 5xx, timeouts, connection errors; a lease no heartbeat
    renews; a full disk), which generate's committer retries with backoff; False for the rest,
    which the same call meets again however long it waits (access denied, missing or expired
    credentials, a damaged manifest, a settings clash, a foreign object, a protected prefix, a
    store error nobody classified): they stop the command with their one line."""

    outage: ClassVar[bool] = False


class LeaseUnconfirmedError(StoreError):
    """The run lease could not be renewed (the store does not answer): no commit until it is;
    a store outage like any other, retried (a takeover would be LeaseLostError)."""

    outage = True


class StoreAccessError(StoreError):
    """The store refuses this process, and will until someone changes a setting: access denied
    (a bucket policy, IAM permissions, a file or directory's mode), or the credentials are
    missing, invalid or expired. Not an outage: the message names the object, the cause and
    the fix; waiting or running the same command again does not cure it."""


# errno -> (what a user reads, what to do about it besides writing elsewhere)
DISK_ERRNOS = {
    errno.ENOSPC: ("no space left on the device", "free space there, or "),
    errno.EDQUOT: ("the disk quota is exceeded", "free some of your files there, or "),
    errno.EROFS: ("the file system is read-only", ""),
}


class DiskError(StoreError):
    """A local file cannot be written: the disk is full (ENOSPC), over quota (EDQUOT) or
    read-only (EROFS: ReadOnlyDiskError). A full disk is an outage, so generate's committer
    waits while someone frees space (a full run store); every other command prints it as one
    line (exit 1)."""

    outage = True

    @classmethod
    def of(cls, exc: BaseException, where: str, elsewhere: str) -> DiskError | None:
        """The one-line DiskError for ``exc`` met writing ``where`` when it is a disk
        condition (``DISK_ERRNOS``, also inside pyarrow's OSError), else None. ``elsewhere``
        says how to write to another place (``choose another --out``)."""
        if not isinstance(exc, OSError) or exc.errno not in DISK_ERRNOS:
            return None
        what, fix = DISK_ERRNOS[exc.errno]
        kind = ReadOnlyDiskError if exc.errno == errno.EROFS else cls
        return kind(f"{where}: cannot write: {what}; {fix}{elsewhere}")


class ReadOnlyDiskError(DiskError):
    """The file system is read-only (EROFS: mounted so, or remounted after an I/O error). No
    outage: waiting does not make it writable, so generate stops in one line, what it
    committed kept, instead of waiting for space nobody will free."""

    outage = False


@contextlib.contextmanager
def disk_errors(where: str, elsewhere: str) -> Iterator[None]:
    """Turn a full, over-quota or read-only disk met inside into one DiskError naming
    ``where`` and how to write ``elsewhere``; every other error passes unchanged."""
    try:
        yield
    except OSError as exc:
        err = DiskError.of(exc, where, elsewhere)
        if err is None:
            raise
        raise err from exc


class AlreadyExistsError(StoreError):
    """A create-only write found an object already at that key."""


class ProtectedPrefixError(StoreError):
    """A write location equals, contains or lies inside a protected prefix."""


class RunMismatchError(StoreError):
    """The output prefix holds a run whose settings differ from the requested ones."""


class UnreadableObjectError(StoreError):
    """An object of the run holds what its format does not allow (a manifest or history entry
    that is not a JSON object): the same read meets the same bytes again."""


class UnreadableShardError(UnreadableObjectError):
    """A run's shard cannot be read (damaged bytes, a cut footer, another format); the message
    says how to set it aside (``store/quarantine.py``) and regenerate its prompts."""


class TransientStoreError(StoreError):
    """A store failure worth retrying: throttling, 5xx, a timeout, a connection refused, reset
    or cut short (S3), or a local file system that does not answer now (ETIMEDOUT, EAGAIN)."""

    outage = True


class RunLeaseError(DraftdataError):
    """The run lease forbids this process to write (not a store outage: never retried)."""


class LeaseHeldError(RunLeaseError):
    """Another live process holds the lease of this run (or of an overlapping partition)."""


class LeaseLostError(RunLeaseError):
    """This process lost the run lease (presumed dead, taken over); it must stop committing."""


class FleetError(DraftdataError):
    """The inference fleet cannot be used: nothing reachable, or a server failed to start."""


class FleetUnavailableError(FleetError):
    """No endpoint could serve for the allowed time, all refuse, or the same request refusal
    ended most of the first requests (``generate/engine/opening.py``): the run stops, resumable."""


class RunAbortedError(DraftdataError):
    """An unexpected error (a bug, not a store outage) stopped a run; what was committed is
    kept and the same command resumes."""


class WorkerDiedError(DraftdataError):
    """A worker process of a command's pool died while the pool was open (the message says
    how: the signal that killed it, or its exit code); what was written is kept."""


class VerificationError(DraftdataError):
    """The hidden states a command wrote differ from the same samples computed one at a time
    by more than rounding (a batching, padding or offset fault of the engine): the command
    stops, naming the layer and the difference."""


class RefusedRequestError(DraftdataError):
    """A chat request the simulated server refuses as an engine would: HTTP ``status`` with
    ``message`` (``sim/request.py`` raises it, ``sim/server.py`` answers it)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class ServerError(DraftdataError):
    """One request to an inference server failed. ``reason`` is the failure's name in a
    Failure record and in an endpoint's error counts; ``status`` the HTTP status (None without
    an answer); ``retry_after`` the server's Retry-After in seconds, where it sent one."""

    reason: str = "server_error"

    def __init__(
        self, message: str, *, status: int | None = None, retry_after: float | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.retry_after = retry_after

    @property
    def said(self) -> str:
        """What the server answered, each part once: ``HTTP 400: Unsupported parameter:
        top_k``; ``HTTP 404`` for an answer that gave no reason (or only its status again:
        ``HTTP 404``, ``404: Not Found`` is ``HTTP 404: Not Found``); the message alone where
        there was no answer. Every line that shows a server's error shows this."""
        if self.status is None:
            return self.message
        status = f"HTTP {self.status}"
        reason = self.message.strip()
        for echo in (status, str(self.status)):  # the status again, as servers often put it
            if reason.startswith(echo) and not reason[len(echo) : len(echo) + 1].isalnum():
                reason = reason[len(echo) :].lstrip(" :-")
                break
        return f"{status}: {reason}" if reason else status

    def __str__(self) -> str:
        return f"{self.reason}: {self.said}"


class RetryableServerError(ServerError):
    """A failure that another attempt (perhaps on another endpoint) may not hit: a 5xx, an
    answer the server aborted."""

    reason = "server_error"


class MalformedAnswerError(RetryableServerError):
    """An answer whose body is not a chat completion (or a transport failure nobody mapped)."""

    reason = "malformed"


class RateLimitedError(RetryableServerError):
    """The server asked to slow down (429)."""

    reason = "rate_limited"


class RequestTimeoutError(RetryableServerError):
    """No whole answer within the read timeout (or the server's 408); the endpoint's health
    is checked."""

    reason = "timeout"


class ConnectionLostError(RetryableServerError):
    """No connection, or it broke before the whole answer (reset, disconnect, cut short); the
    endpoint's health is checked."""

    reason = "connection"


class EndpointFaultError(ServerError):
    """The endpoint, not the prompt, is at fault: it is taken out at once and the request
    moves on without counting as an attempt of the prompt."""

    reason = "endpoint_fault"


class EndpointRefusedError(EndpointFaultError):
    """The endpoint answers but refuses chat requests (a rotated key, a renamed model, not an
    OpenAI-compatible server: 401/403/404/405/407/501)."""

    reason = "refused"


class ImpossibleAnswerError(EndpointFaultError):
    """An answer over its size bound or with impossible usage (``generate/answers/bounds.py``)."""

    reason = "impossible"


class FatalRequestError(ServerError):
    """The request is invalid for this model; retrying it cannot succeed."""

    reason = "invalid_request"


class ContextLengthError(FatalRequestError):
    """The prompt plus the requested output does not fit the model's context."""

    reason = "context_length"


class Interrupted(BaseException):
    """SIGINT or SIGTERM stopped the command (its worker processes already killed); the CLI
    says how to continue and exits with 128 + the signal number. Not an Exception, so
    ``except Exception`` clauses let it through, like KeyboardInterrupt."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.signame = signal.Signals(signum).name
        super().__init__(f"stopped by {self.signame}")

    def __reduce__(self) -> tuple[object, ...]:
        return _rebuilt, (type(self), self.args, dict(self.__dict__))  # (as DraftdataError's)
