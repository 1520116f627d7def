"""Layer 11: the utilities every layer may use; they import nothing of the project but errors.

- ``config.py``: YAML -> typed structs, with one-line errors.
- ``gc_tuning.py``: the garbage collector's settings while a long batch loop runs.
- ``metrics.py``: ``StageStats``, the one counter-and-timer mechanism of every stage.
- ``progress.py``: progress as every stage shows it.
- ``redact.py``: secrets out of what is shown or stored.
- ``tables.py``: the rich tables the summaries print.
- ``workerpool.py``: process pools whose workers end with their parent.

None imports another (ARCHITECTURE.md; ``tests/unit/test_architecture.py`` checks it). This
package's own module imports nothing.
"""
