"""Where SGLang's CPU kernel library cannot load: its names, and nothing that computes.

The SGLang CPU kit's kernels (the ``sgl_kernel`` module of its wheel) are compiled for
x86-64-v4 with AVX512-BF16/VNNI; on a CPU without them the library dies with SIGILL as it loads.
SGLang 0.5.23 uses those kernels only where the CPU has AMX: elsewhere every op of a Qwen3
model runs on torch's own CPU code, but SGLang still imports a few names from the library at
start (``copy_all_layer_kv_cache_cpu``, ``assign_req_to_token_pool_cpu``, ...). This package
provides those names and no behaviour: calling any of them raises, so a server that did need a
kernel stops with that error rather than computing something else.

The SGLang tier puts this folder's parent on the server's ``PYTHONPATH`` only when
``scripts/sglang_cpu_check.sh`` says the CPU cannot run the kernels, and says so when it does;
everything the server does is SGLang's own code.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ABSENT = True  # what the tier checks: this is not the kit's library


class KernelUnavailableError(RuntimeError):
    """A kernel of SGLang's CPU library was called where the library cannot load."""


def __getattr__(name: str) -> Callable[..., Any]:
    if name.startswith("__"):
        raise AttributeError(name)

    def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise KernelUnavailableError(
            f"sgl_kernel.{name} was called, but SGLang's CPU kernels cannot load on this CPU "
            "(scripts/sglang_cpu_check.sh)"
        )

    unavailable.__name__ = name
    return unavailable
