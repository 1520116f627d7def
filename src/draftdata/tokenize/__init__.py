"""The tokenize stage: a run's completions -> token-exact training samples with loss masks.

- ``config.py``: ``TokenizeConfig`` (in) and ``TokenizeSummary`` (out).
- ``template.py``: the target's tokenizer and chat template; rendering like apply_chat_template,
  with the spans of ``{% generation %}`` blocks; the conversation the engine sent.
- ``plan.py``: which samples a completion becomes (per-turn when the template rewrites history)
  and where the loss goes, as text spans (rendered path) or server ids (token-id path).
- ``encode.py``: ``tokenize_table(table, ctx)``, the pure batch function (one batched encode,
  masks from offsets, verification, length policy) and ``TokenizeContext``.
- ``arrow.py``: Arrow completion rows -> views (token ids stay numpy), samples -> a table.
- ``stage.py``: ``tokenize(config)``: shards in, create-only sample shards + summary.json out.

The demo's locally trained BPE tokenizer is ``demo/tokenizer.py``.
"""
