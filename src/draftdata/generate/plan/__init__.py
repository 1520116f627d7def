"""``generate --pilot``: a sample run into the run, and the forecast of the whole run from it.

- ``pilot.py``: the pilot: runs the stage on the sample, then forecasts.
- ``pilot_sample.py``: the pilot's stratified, seeded draw of the prompts in scope.
- ``saturation.py``: the fleet's saturated output rate, measured while the pilot runs.
- ``forecast.py``: the forecast's maths (tokens, time, the mix), as ``store/forecast.py``'s
  record.

The top floor of generate: it runs ``stage.generate`` and reads the engine; nothing in
generate imports it.
"""
