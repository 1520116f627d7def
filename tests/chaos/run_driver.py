"""A tiny stand-in for the generate engine, for kill -9 tests of the Run writer.

Usage: python run_driver.py URL N [FLUSH_RECORDS [FLUSH_SECONDS]]. It opens the run, skips done
prompts, and "generates" the rest with a short sleep each (prompt ids divisible by 13 fail
fatally), flushing when due.
"""

from __future__ import annotations

import sys
import time

from draftdata.records import Completion, Failure, Message, Turn
from draftdata.store import Run


def main(url: str, n: int, flush_records: int = 7, flush_seconds: float = 0.05) -> None:
    """Run the driver to completion (or until killed)."""
    settings = {"model": "sim", "n": n}
    run = Run.open(url, settings=settings, flush_records=flush_records, flush_seconds=flush_seconds)
    for i in range(n):
        pid = f"p{i:05d}"
        if run.is_done(pid):
            continue
        time.sleep(0.002)
        if i % 13 == 0:
            run.add_failure(Failure(id=pid, reason="context_length", message="too long"))
        else:
            run.add_completion(
                Completion(
                    id=pid,
                    messages=[Message(role="user", content=f"q{i}")],
                    turns=[Turn(content=f"a{i}" * 50)],
                )
            )
        if run.flush_due():
            run.flush()
    run.close()
    print("DONE", flush=True)


if __name__ == "__main__":
    flush = [int(a) for a in sys.argv[3:4]] + [float(a) for a in sys.argv[4:5]]
    main(sys.argv[1], int(sys.argv[2]), *flush)
