"""The live server's Prometheus metrics, under vLLM's names, in simulated time.

One :class:`ServerMetrics` per server, on a registry of its own (two servers in one
process, as in the tests, never share a counter). Latencies are the simulation's own
numbers (simulated seconds), recorded as the driver reports tokens and ends, with
vLLM's histogram buckets; the gauges are read from the driver when scraped. simsim's
first token comes from the first decode step (``docs/semantics.md``), and the time to
first token reported here is exactly the request table's ``ttft_us``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from simsim.live.driver import TokenUpdate
from simsim.request import Request, RequestState

__all__ = ["CONTENT_TYPE", "ServerMetrics"]

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
"""The media type of the Prometheus text format that :meth:`ServerMetrics.render` writes."""

# vLLM's buckets (vllm/v1/metrics/loggers.py), so dashboards built for vLLM read these.
_TTFT_BUCKETS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
    7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
_ITL_BUCKETS = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
    10.0, 20.0, 40.0, 80.0,
)  # fmt: skip
_REQUEST_BUCKETS = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
    120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip

_US = 1e-6


class _ReadAtScrape(Collector):
    """What is read from the server when scraped: running, waiting, KV-cache usage,
    preemptions and the simulation's lag."""

    def __init__(
        self,
        labels: dict[str, str],
        counts: Callable[[], tuple[int, int]],
        kv_cache_usage: Callable[[], float | None],
        lag_s: Callable[[], float] | None,
        preemptions: Callable[[], int] | None,
    ) -> None:
        self._labels = labels
        self._counts = counts
        self._kv_cache_usage = kv_cache_usage
        self._lag_s = lag_s
        self._preemptions = preemptions

    def collect(self) -> Iterator[Metric]:
        names, values = list(self._labels), list(self._labels.values())
        running, waiting = self._counts()
        for name, help_text, value in (
            ("vllm:num_requests_running", "Requests holding a slot (simulated).", running),
            ("vllm:num_requests_waiting", "Requests queued or preempted (simulated).", waiting),
            (
                "vllm:kv_cache_usage_perc",
                "Fraction of KV-cache blocks in use, 0 to 1 (0 without a KV cache).",
                self._kv_cache_usage() or 0.0,
            ),
        ):
            family = GaugeMetricFamily(name, help_text, labels=names)
            family.add_metric(values, float(value))
            yield family
        if self._preemptions is not None:
            counter = CounterMetricFamily(
                "vllm:num_preemptions",
                "Preemptions of requests whose KV blocks were needed (simulated).",
                labels=names,
            )
            counter.add_metric(values, self._preemptions())
            yield counter
        if self._lag_s is not None:
            family = GaugeMetricFamily(
                "simsim:simulation_lag_seconds",
                "Wall seconds the simulation is behind real time (0 when it keeps up; "
                "lower --speed if it grows).",
                labels=names,
            )
            family.add_metric(values, self._lag_s())
            yield family


class ServerMetrics:
    """The metrics of one served model, fed by the driver (a ``DriverObserver``).

    *counts*, *kv_cache_usage*, *lag_s* and *preemptions* are read at every scrape (the
    driver's :meth:`~simsim.live.driver.LiveDriver.counts`, ``kv_cache_usage``, ``lag_s``
    and ``preemptions``); without *lag_s* there is no ``simsim:simulation_lag_seconds``
    gauge, and without *preemptions* no ``vllm:num_preemptions_total``.
    """

    def __init__(
        self,
        model_name: str,
        counts: Callable[[], tuple[int, int]],
        kv_cache_usage: Callable[[], float | None],
        lag_s: Callable[[], float] | None = None,
        preemptions: Callable[[], int] | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        labels = {"model_name": model_name, "engine": "0"}
        self._labels = labels
        names = list(labels)
        registry = self.registry

        def histogram(name: str, help_text: str, buckets: tuple[float, ...]) -> Histogram:
            metric = Histogram(name, help_text, names, buckets=buckets, registry=registry)
            return metric.labels(**labels)

        def counter(name: str, help_text: str) -> Counter:
            return Counter(name, help_text, names, registry=registry).labels(**labels)

        self._ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Time to first token, simulated seconds.",
            _TTFT_BUCKETS,
        )
        self._itl = histogram(
            "vllm:inter_token_latency_seconds",
            "Time between consecutive output tokens, simulated seconds.",
            _ITL_BUCKETS,
        )
        self._e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "End-to-end latency of finished requests, simulated seconds.",
            _REQUEST_BUCKETS,
        )
        self._queue = histogram(
            "vllm:request_queue_time_seconds",
            "Time from arrival to admission, simulated seconds.",
            _REQUEST_BUCKETS,
        )
        self._prefill_time = histogram(
            "vllm:request_prefill_time_seconds",
            "Admission to first token, simulated seconds (simsim's first token comes from "
            "the first decode step).",
            _REQUEST_BUCKETS,
        )
        self._decode_time = histogram(
            "vllm:request_decode_time_seconds",
            "First token to finish of finished requests, simulated seconds.",
            _REQUEST_BUCKETS,
        )
        self._inference_time = histogram(
            "vllm:request_inference_time_seconds",
            "Admission to finish of finished requests, simulated seconds.",
            _REQUEST_BUCKETS,
        )
        self._prompt_tokens = counter("vllm:prompt_tokens", "Prompt tokens of admitted requests.")
        self._generation_tokens = counter("vllm:generation_tokens", "Output tokens generated.")
        self._success = Counter(
            "vllm:request_success",
            "Requests ended, by finish reason (length: finished; abort: cancelled).",
            [*names, "finished_reason"],
            registry=registry,
        )
        self._rejected = Counter(
            "simsim:rejected_requests",
            "Requests answered with an error: refused before reaching the simulation, or "
            "turned away by the scenario's admission control, by reason.",
            [*names, "reason"],
            registry=registry,
        )
        registry.register(_ReadAtScrape(labels, counts, kv_cache_usage, lag_s, preemptions))

    # ------------------------------------------------------------------ observer

    def request_submitted(self, request: Request) -> None:
        """Nothing to count yet: prompts are counted when admitted."""

    def token_generated(self, request: Request, update: TokenUpdate, gap_us: int | None) -> None:
        """Count the token; the first one gives the queue time, prompt and TTFT."""
        self._generation_tokens.inc()
        if gap_us is None:
            self._first_token(request)
        else:
            self._itl.observe(gap_us * _US)

    def request_ended(self, request: Request) -> None:
        """Count the end; a request with no token gives its queue time and prompt here.

        A request the admission control turned away at its arrival did not end: it was
        refused, and counts as rejected under its ``rejection`` reason.
        """
        if request.rejection is not None:
            self.rejected(request.rejection)
            return
        if request.generated_token_count == 0 and request.admit_time_us is not None:
            self._admitted(request)
        if request.state is RequestState.FINISHED:
            finish = request.finish_time_us
            assert finish is not None and request.admit_time_us is not None
            self._e2e.observe((finish - request.arrival_time_us) * _US)
            self._inference_time.observe((finish - request.admit_time_us) * _US)
            if request.first_token_time_us is not None:
                self._decode_time.observe((finish - request.first_token_time_us) * _US)
            reason = "length"
        else:
            reason = "abort"
        self._success.labels(**self._labels, finished_reason=reason).inc()

    def rejected(self, reason: str) -> None:
        """A request was refused (*reason*): before reaching the simulation, or by its
        admission control."""
        self._rejected.labels(**self._labels, reason=reason).inc()

    def render(self) -> bytes:
        """Every metric in the Prometheus text format."""
        return generate_latest(self.registry)

    # ------------------------------------------------------------------ inside

    def _first_token(self, request: Request) -> None:
        assert request.first_token_time_us is not None
        self._ttft.observe((request.first_token_time_us - request.arrival_time_us) * _US)
        self._admitted(request)
        assert request.admit_time_us is not None
        self._prefill_time.observe((request.first_token_time_us - request.admit_time_us) * _US)

    def _admitted(self, request: Request) -> None:
        assert request.admit_time_us is not None
        self._queue.observe((request.admit_time_us - request.arrival_time_us) * _US)
        self._prompt_tokens.inc(request.prompt_token_count)
