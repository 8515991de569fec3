"""A served model, start to stop: engine, driver, metrics and app under uvicorn.

:class:`LiveServer` is what ``simsim serve`` runs in the foreground, and what a test
or a script runs in a background thread (``with LiveServer(...) as server:``). It binds
its own socket (``127.0.0.1`` unless told otherwise; port 0 picks a free one), so the
address is known before the first request.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from dataclasses import replace
from types import TracebackType

import uvicorn

from simsim.engines.server import Server
from simsim.live.app import create_app
from simsim.live.driver import LiveAction, LiveDriver
from simsim.live.metrics import ServerMetrics
from simsim.live.wire import ServeOptions
from simsim.scenario.model import Scenario

__all__ = ["DEFAULT_MAX_MODEL_LEN", "LiveServer", "default_max_model_len", "serving_engine"]

DEFAULT_MAX_MODEL_LEN = 8192
"""The context limit of a server without a KV cache (one with a cache: its capacity)."""


def serving_engine(scenario: Scenario) -> Server:
    """The server that serves *scenario*: its engine, or with ``[cluster]`` its cluster
    (routed as offline), but of ``single_slot`` engines for ``single_slot_fast``.

    The fast engine skips decode steps, so it has no token events to stream; the full
    single slot gives the same request table.
    """
    return scenario.build_served()


class _Uvicorn(uvicorn.Server):
    """uvicorn, stopping the simulation first when it shuts down.

    uvicorn waits for open responses before it runs the app's shutdown; stopping the
    driver first ends every open stream at once (with an error chunk), so a shutdown
    never waits on simulated work.
    """

    def __init__(self, config: uvicorn.Config, driver: LiveDriver) -> None:
        super().__init__(config)
        self._driver = driver

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        if self._driver.started:
            self._driver.stop()
        await super().shutdown(sockets)


class LiveServer:
    """*engine* served over HTTP in real time, scaled by *speed*.

    *engine* is any fresh :class:`~simsim.Server` (an engine, or a cluster behind one
    endpoint); :func:`serving_engine` builds one from a scenario.
    ``options`` sets the wire behaviour (:class:`~simsim.live.app.ServeOptions`); without
    it the model is called ``simsim``. A context limit left at ``None`` becomes the KV
    cache's capacity (:data:`DEFAULT_MAX_MODEL_LEN` without a cache).
    """

    def __init__(
        self,
        engine: Server,
        *,
        speed: float = 1.0,
        options: ServeOptions | None = None,
        host: str = "127.0.0.1",
        port: int = 8000,
    ) -> None:
        if options is None:
            options = ServeOptions()
        if options.max_model_len is None:
            options = replace(options, max_model_len=default_max_model_len(engine))
        self.options = options
        self.driver = LiveDriver(engine, speed=speed)
        self.metrics = ServerMetrics(
            options.model,
            self.driver.counts,
            self.driver.kv_cache_usage,
            self.driver.lag_s,
            self.driver.preemptions,
        )
        self.driver.observer = self.metrics
        self.app = create_app(self.driver, self.metrics, options)
        self._socket = _bind(host, port)
        self.host, self.port = self._socket.getsockname()[:2]
        config = uvicorn.Config(
            self.app,
            log_level="warning",
            access_log=False,
            lifespan="on",
            timeout_graceful_shutdown=5,
        )
        self._uvicorn = _Uvicorn(config, self.driver)
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    # ------------------------------------------------------------------ accessors

    @property
    def engine(self) -> Server:
        """The server being served; read its frames once the server has stopped."""
        return self.driver.engine

    @property
    def url(self) -> str:
        """The server's root URL, e.g. ``http://127.0.0.1:8000``."""
        return f"http://{self.host}:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI API's base URL (``url`` + ``/v1``), as the ``openai`` client takes it."""
        return f"{self.url}/v1"

    @property
    def actions(self) -> tuple[LiveAction, ...]:
        """Every submission and cancellation, for :func:`~simsim.live.driver.replay`."""
        return self.driver.actions

    @property
    def stopped_at_us(self) -> int:
        """The simulated time the server is at (its last time, once stopped)."""
        return self.engine.env.now

    def metrics_text(self, timeout_s: float = 30.0) -> str:
        """The ``/metrics`` page now, from any thread.

        While the server runs in a background thread (:meth:`start`), the page is
        rendered on the server's event loop, where the simulation lives; once stopped,
        here.
        """
        loop = self.driver.loop
        if self.driver.started and loop is not None and loop.is_running():
            future = asyncio.run_coroutine_threadsafe(self._render(), loop)
            return future.result(timeout_s)
        return self.metrics.render().decode()

    async def _render(self) -> str:
        self.driver.catch_up()
        return self.metrics.render().decode()

    # ------------------------------------------------------------------ running

    def run(self) -> None:
        """Serve in the foreground until Ctrl-C (SIGINT) or SIGTERM; then stop cleanly."""
        try:
            asyncio.run(self._uvicorn.serve(sockets=[self._socket]))
        finally:
            self._socket.close()

    def start(self, timeout_s: float = 10.0) -> LiveServer:
        """Serve in a background thread; return once the server accepts requests."""
        if self._thread is not None:
            raise RuntimeError("the server has already been started")

        def serve() -> None:
            try:
                asyncio.run(self._uvicorn.serve(sockets=[self._socket]))
            except BaseException as error:  # reported by start() or stop()
                self._error = error

        self._thread = threading.Thread(target=serve, name=f"simsim-serve-{self.port}", daemon=True)
        self._thread.start()
        ready = threading.Event()
        while not self._uvicorn.started:
            if not self._thread.is_alive() or ready.wait(0.005) or timeout_s <= 0:
                break
            timeout_s -= 0.005
        if not self._uvicorn.started:
            self.stop()
            raise RuntimeError(f"the server did not start: {self._error!r}")
        return self

    def stop(self, timeout_s: float = 30.0) -> None:
        """Stop a server started with :meth:`start` and wait for its thread to end."""
        self._uvicorn.should_exit = True
        thread = self._thread
        if thread is not None:
            thread.join(timeout_s)
            if thread.is_alive():
                self._uvicorn.force_exit = True
                thread.join(timeout_s)
        self._socket.close()

    def __enter__(self) -> LiveServer:
        return self.start()

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def default_max_model_len(engine: Server) -> int:
    """The context limit *engine* can hold: its KV cache's tokens (a cluster: the
    smallest replica cache), or the default without a KV cache."""
    capacity = engine.kv_capacity_tokens
    return DEFAULT_MAX_MODEL_LEN if capacity is None else capacity


def _bind(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    # Protocol IPPROTO_TCP, not 0: asyncio turns Nagle's algorithm off (TCP_NODELAY) only
    # on accepted sockets that say they are TCP. With it on, a token chunk written while
    # the previous one is unacknowledged waits for the client's delayed ACK (~40 ms).
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError:
        sock.close()
        raise
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock
