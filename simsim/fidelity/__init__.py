"""Fidelity: measure a real OpenAI-compatible server, fit a cost model, and compare.

The loop ``docs/fidelity.md`` describes: ``simsim replay`` plays a scenario's workload
against a server and records what it measured in simsim's own tables; ``simsim
calibrate`` probes a server and fits a :class:`~simsim.FittedBackend`; ``simsim
compare`` reports how far a simulation's latencies are from a measurement's (or one
measurement's from another's, the server's own noise). Real time lives here, in the
client; the engines never read a clock.

Modules: :mod:`simsim.fidelity.replay` and :mod:`simsim.fidelity.measured` (the client
and what it records; they need the ``fidelity`` extra, httpx), :mod:`simsim.fidelity.
calibrate` and :mod:`simsim.fidelity.fit` (probing and fitting), and
:mod:`simsim.fidelity.compare`. Nothing is imported here, so ``import simsim.fidelity``
needs no extra.
"""

from __future__ import annotations
