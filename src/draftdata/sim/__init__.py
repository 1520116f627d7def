"""The simulated OpenAI-compatible server: one engine ``fleet`` can launch (and tests use).

``run`` starts servers (in-process ``SimFleet``, subprocess ``SimProcess``, ``serve`` for
``draftdata fleet sim``); ``server`` is the HTTP server; ``request``, ``shapes``, ``answers``,
``tokens``, ``batch`` and ``config`` are its parts (see ``run``'s docstring for every response
shape). It imports nothing of ``fleet``; ``fleet`` launches it as a command.
"""
