"""The real-time layer: simsim's engines served as an OpenAI-compatible HTTP server.

``simsim serve`` runs a :class:`LiveServer`: a :class:`LiveDriver` keeps the simulated
clock on the wall clock (scaled by ``speed``), the app (:func:`create_app`) speaks
OpenAI's wire format, and :class:`ServerMetrics` exports vLLM's metric names. Needs the
``serve`` extra: ``pip install 'simsim[serve]'``. ``docs/serve.md`` is the guide.
"""

from __future__ import annotations

try:
    import prometheus_client  # noqa: F401
    import starlette  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as error:  # pragma: no cover - depends on what is installed
    raise ImportError(
        f"simsim.live needs the serve extra ({error.name} is missing): pip install 'simsim[serve]'"
    ) from error

from simsim.live.app import create_app
from simsim.live.driver import (
    DriverObserver,
    LiveAction,
    LiveDriver,
    LiveRequest,
    TokenUpdate,
    replay,
)
from simsim.live.metrics import ServerMetrics
from simsim.live.server import (
    DEFAULT_MAX_MODEL_LEN,
    LiveServer,
    default_max_model_len,
    serving_engine,
)
from simsim.live.tokens import count_text_tokens, filler_text
from simsim.live.wire import ApiError, ServeOptions

__all__ = [
    "DEFAULT_MAX_MODEL_LEN",
    "ApiError",
    "DriverObserver",
    "LiveAction",
    "LiveDriver",
    "LiveRequest",
    "LiveServer",
    "ServeOptions",
    "ServerMetrics",
    "TokenUpdate",
    "count_text_tokens",
    "create_app",
    "default_max_model_len",
    "filler_text",
    "replay",
    "serving_engine",
]


def __dir__() -> list[str]:
    # The public API, not the extras checked above or `annotations`.
    dunders = (name for name in globals() if name.startswith("__") and name.endswith("__"))
    return sorted({*__all__, *dunders})
