"""The built-in scenario that ``simsim run`` runs when no file is given."""

from __future__ import annotations

from simsim.backend import SimulatedBackendConfig
from simsim.scenario.model import Cancellation, Scenario
from simsim.workloads import OpenLoopWorkload, PoissonArrivals, Uniform, check_seed

__all__ = ["default_scenario"]


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
