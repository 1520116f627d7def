"""Reading rows from files: one small reader per format over one base.

- ``base.py``: ``Reader``, the row loop every format shares: it numbers the rows, skips and
  limits them, turns each raw row into the caller's value (``Parse``), hands a bad row to the
  caller as a ``RowError`` located ``file:line`` (never stopping the read), counts what it read
  and rejected, and reports progress. ``RowFile`` is one file to read (where it is, how to
  open it); ``open_bytes`` opens one, decompressing ``.gz``.
- ``jsontext.py``: JSON text, a file of JSON lines or one JSON array (told apart by content),
  streamed: lines one by one, an array element by element.
- ``parquet.py``: parquet, a batch of rows at a time.
- ``hub.py``: a Hugging Face hub dataset, streamed by ``datasets``.
- ``files.py``: a list of files of any of these formats, each read by its format's reader.

prepare reads its sources and ``stats`` every dataset through these readers, so a JSON array,
a bad line or a compressed file behaves the same in every command. Nothing here knows what a
row means (prompts, conversations, samples): the caller's ``Parse`` does.
"""
