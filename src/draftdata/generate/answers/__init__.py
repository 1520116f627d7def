"""What an answer is: the lowest floor of generate, importing nothing of it.

- ``parse.py``: chat-completion bodies -> Turns.
- ``bounds.py``: the size bound of a response body and the checks of its usage.
- ``thinking.py``: the thinking mode each server applies, per endpoint and per answer.
"""
