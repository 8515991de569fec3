"""The built-in scenarios: what ``simsim run`` and ``simsim serve`` use when no file is given."""

from __future__ import annotations

from simsim.backend import SimulatedBackendConfig
from simsim.engines import KvCacheConfig
from simsim.scenario.model import BatchingSpec, Cancellation, Scenario
from simsim.workloads import OpenLoopWorkload, PoissonArrivals, Uniform, check_seed

__all__ = ["default_scenario", "default_serve_scenario"]


def default_scenario(seed: int = 0) -> Scenario:
    """The built-in scenario of ``simsim run``: 1500 Poisson requests at about 80% load.

    Prompts are uniform on 16..1024 tokens and outputs on 0..128; the mean service time
    is about 0.54 s, so 1.5 arrivals per second keep the single slot about 80% busy.
    Seven requests are cancelled along the way.
    """
    return Scenario(
        name="default",
        backend=SimulatedBackendConfig(
            prefill_base_us=2_000,
            prefill_per_token_us=50,
            prefill_per_active_sequence_us=0,
            decode_base_us=8_000,
            decode_per_active_sequence_us=0,
        ),
        workload=OpenLoopWorkload(
            arrivals=PoissonArrivals(1.5),
            prompt_tokens=Uniform(16, 1024),
            output_tokens=Uniform(0, 128),
            count=1_500,
        ),
        cancellations=tuple(Cancellation(60_000_000 * k, 100 * k) for k in range(1, 8)),
        seed=check_seed(seed),
        source="<built-in default>",
    )


def default_serve_scenario() -> Scenario:
    """The built-in server of ``simsim serve``: continuous batching with a KV cache.

    Up to 32 requests share each iteration (``prefill_first``, at most 8192 batched
    tokens); the KV cache holds 65,536 tokens in 16-token blocks. Costs are the
    default scenario's plus a price per active sequence, so a fuller batch runs each
    step more slowly: a lone request decodes a token every 8.25 ms, a full batch every
    16 ms. Clients send the requests, so the scenario has none.
    """
    return Scenario(
        name="serve-default",
        engine="batching",
        batching=BatchingSpec(
            max_active_requests=32,
            max_batch_tokens=8192,
            kv_cache=KvCacheConfig(block_size_tokens=16, total_blocks=4096),
        ),
        backend=SimulatedBackendConfig(
            prefill_base_us=2_000,
            prefill_per_token_us=50,
            prefill_per_active_sequence_us=0,
            decode_base_us=8_000,
            decode_per_active_sequence_us=250,
        ),
        source="<built-in serve default>",
    )
