"""Small record factories for the store tests."""

from __future__ import annotations

from draftdata.records import Completion, Failure, Message, Turn


def completion(i: int | str, sample: int = 0) -> Completion:
    """A minimal valid completion for prompt ``p<i>``."""
    pid = i if isinstance(i, str) else f"p{i}"
    return Completion(
        id=pid,
        sample=sample,
        messages=[Message(role="user", content=f"question {pid}")],
        turns=[Turn(content=f"answer {pid}", reasoning="thinking", finish_reason="stop")],
        model="m",
        server_thinking=True,  # answered in the server's default mode, thinking on
    )


def failure(i: int | str, reason: str = "context_length") -> Failure:
    """A failure for prompt ``p<i>``."""
    pid = i if isinstance(i, str) else f"p{i}"
    return Failure(id=pid, reason=reason, message="too long", attempts=1)
