"""Layer 9: what two or more stages share, each module named for what it is.

- ``conversation.py``: prompt + generated turns -> the conversation, the one rule.
- ``formats.py``: the parquet schemas and JSON files draftdata writes, and their versions.
- ``endpoints.py``: probing one OpenAI-compatible server.
- ``fleetspec.py``: the fleet file (fleet.yaml), read and written.
- ``domains.py``: the domain classifier.
- ``mix.py``: the mix, read and checked, and its arithmetic.
- ``tokens.py``: token counts of chat rows.
- ``speculation.py``: speculative decoding's figures and the acceptance files.
- ``trainer_rows.py``: the JSON rows each drafter trainer reads.
- ``tokenizer_folder.py``: what makes a tokenizer folder.
- ``paths.py``: what a file or folder option must be.
- ``readers/``: reading rows from files, one small reader per format over one base.

They sit above ``records.py`` and ``support/`` and below every stage; none imports another
(ARCHITECTURE.md; ``tests/unit/test_architecture.py`` checks it). This package's own module
imports nothing.
"""
