"""draftdata: self-distillation training data for speculative-decoding drafters.

The pipeline is prepare -> generate -> tokenize -> merge (plus stats, report, fleet, export);
each stage lives in its own package and is reachable both as a CLI subcommand and as a plain
Python function.
"""

__version__ = "0.1.0"
