"""generate's engine: one event loop and the layers of one answer's way, top down.

- ``loop.py``: ``Engine``, the event loop's tasks around the dispatcher; shutdown.
- ``committer.py``: the commit path from the run's buffers to the store, through outages.
- ``keeper.py``: the health check and the reviver the dispatcher calls.
- ``dispatch.py``: ``Dispatcher``, the scheduler, with its parts ``queue.py`` (which job
  next), ``placement.py`` (where it goes), ``retry.py`` (a failed attempt's fate),
  ``opening.py`` (the verdicts on a refused request, the first ones' above all) and
  ``recheck.py`` (a later refusal of the whole fleet: the prompt's, or a fleet that changed).
- ``caller.py``: one attempt of a job, turn by turn.
- ``limits.py``: one request's output limit, retried smaller on a context-length answer.
- ``client.py``: the transport seam, one HTTP request -> Turns or a ServerError.
- ``endpoint.py``: one server as the dispatcher sees it, with ``concurrency.py`` and
  ``breaker.py``.
- ``work.py`` (jobs and copies), ``length.py`` (expected lengths), ``request.py`` (one request
  as a typed item), ``progress.py`` (the live view): what the layers pass around.

The order of the layers is ARCHITECTURE.md's "The generate engine"; it imports the stage's
``config``/``summary``, ``prompts/`` and ``answers/``, never ``stage``, ``preflight`` or
``plan/``.
"""
