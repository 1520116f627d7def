"""The hidden-states stage: the target's features for offline drafter training, exactly once.

``draftdata hidden-states TOKENIZED --model TARGET --out DIR --format speculators|specforge``
runs the target's forward pass over tokenized samples and writes, per sample, the file the
named trainer's offline reader takes, aligned token for token with the sample's input_ids and
loss_mask. The seams, each documented in its module:

- ``backend.py``   the engine seam: a batch of token-id arrays in, per sample a
                   ``[T, layers, hidden]`` tensor out, plus the model's facts; engines register
                   in ``ENGINES`` (``transformers_backend.py`` here, the vLLM engine beside it);
- ``writer.py``    the format seam (``speculators.py``, ``specforge.py``): file names from rows,
                   bytes from states, and back;
- ``commit.py``    the commit layer: create-only sample files, the done-set as their listing,
                   staging bounded in bytes;
- ``config.py``    ``HiddenConfig`` (the command) and ``HiddenSettings`` (what the files depend
                   on, in the manifest);
- ``layers.py``    the layer choice and its index space;
- ``plan.py``      the samples, their rows and batches by length;
- ``setfiles.py``  the set's manifest, index and summaries; ``bill.py`` the size and time bill;
  ``verify.py`` the one-at-a-time recomputation; ``run.py`` the workers; ``stage.py`` the stage.

It sits beside ``export/`` above the stages: it reads samples through ``stats/readers`` and
writes through ``store/``.
"""
