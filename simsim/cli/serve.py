"""``simsim serve``: serve a scenario's server as an OpenAI-compatible HTTP API."""

from __future__ import annotations

import argparse
import gc
import importlib.util
import math
import signal
import sys
from pathlib import Path
from typing import Any

from simsim.admission import ANY_OTHER
from simsim.cli.shared import (
    building_tables,
    install,
    output_folder,
    with_backend,
    write_tables,
)
from simsim.cli.usage import UsageError
from simsim.results import server_replicas, summarize
from simsim.scenario import (
    Scenario,
    default_serve_scenario,
    load_scenario,
    out_of_memory_while,
)
from simsim.scenario.engine_kinds import ENGINE_KINDS
from simsim.scenario.model import Server
from simsim.sweeps.sweep import is_sweep_folder
from simsim.wording import counted

# ServeOptions' fields and the options that set them, for error messages.
_SERVE_OPTIONS = {
    "model": "--model",
    "max_model_len": "--max-model-len",
    "max_waiting": "--max-waiting",
    "retry_after_s": "--retry-after",
    "fail_rate": "--fail-rate",
    "fail_status": "--fail-status",
    "fail_seed": "--fail-seed",
}


class _Terminated(Exception):
    """SIGTERM reached ``simsim serve`` after uvicorn's clean shutdown."""


def execute(args: argparse.Namespace) -> int:
    """Serve the scenario's server over HTTP until stopped, then report (and record) it;
    returns the exit status."""
    missing = [
        name
        for name in ("starlette", "uvicorn", "prometheus_client")
        if importlib.util.find_spec(name) is None
    ]
    if missing:
        print(
            f"simsim: error: serve needs {', '.join(missing)}: {install('serve')}",
            file=sys.stderr,
        )
        return 2
    from simsim.live import LiveServer, ServeOptions, serving_engine
    from simsim.live.wire import OptionError

    scenario = serving_scenario(args.scenario, args.backend)
    if not (math.isfinite(args.speed) and args.speed > 0):
        raise UsageError("--speed", f"must be a positive number, got {args.speed}")
    if not 0 <= args.port <= 65535:
        raise UsageError("--port", f"must be 0 to 65535, got {args.port}")
    fmt = "csv" if args.format is None else args.format
    if args.record is not None and fmt == "parquet" and importlib.util.find_spec("pyarrow") is None:
        print(
            f"simsim: error: --record with --format parquet needs pyarrow: {install('parquet')}",
            file=sys.stderr,
        )
        return 2
    engine = serving_engine(scenario)
    try:
        options = ServeOptions(
            model=args.model,
            max_model_len=args.max_model_len,
            max_waiting=args.max_waiting,
            retry_after_s=args.retry_after,
            fail_rate=args.fail_rate,
            fail_status=args.fail_status,
            fail_seed=args.fail_seed,
        )
    except OptionError as error:  # it names its field; the user typed the option
        raise UsageError(_SERVE_OPTIONS.get(error.field, error.field), error.rule) from None
    try:
        server = LiveServer(
            engine, speed=args.speed, options=options, host=args.host, port=args.port
        )
    except OSError as error:
        reason = error.strerror or str(error)
        print(
            f"simsim: error: cannot listen on {args.host}:{args.port} ({reason})", file=sys.stderr
        )
        return 1
    try:
        out = _record_folder(args.record)
    except UsageError:
        server.stop()
        raise
    for note in serve_notes(scenario):
        print(note, file=sys.stderr)
    print(
        f"simsim serve: model {options.model!r} ({scenario.name}, {served_as(scenario, engine)}"
        f") on {server.base_url} at speed {args.speed:g}; "
        "times are simulated, not measured. Ctrl-C stops.",
        flush=True,
    )
    # Everything built so far lives as long as the server: out of the collector's way, so
    # a full collection never stalls the stream of tokens (one took 25 ms in a benchmark).
    gc.collect()
    gc.freeze()
    previous = signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        server.run()
    except (KeyboardInterrupt, _Terminated):
        pass  # uvicorn has shut down cleanly; it re-raises the signal that stopped it
    finally:
        signal.signal(signal.SIGTERM, previous)
    counts = summarize(engine.requests_frame())["value"]
    total, finished, cancelled = (
        int(counts[row]) for row in ("requests", "count_FINISHED", "count_CANCELLED")
    )
    rejected = ""
    if "count_rejected" in counts:  # turned away by [admission]: answered 429, cancelled
        rejected = f" of which {int(counts['count_rejected'])} rejected"
    print(
        f"served {counted(total, 'request')} ({finished} finished, {cancelled} "
        f"cancelled{rejected}, {total - finished - cancelled} unfinished) in "
        f"{engine.env.now / 1e6:.3f} simulated seconds"
    )
    if out is not None:
        with out_of_memory_while(scenario.source, lambda: building_tables(engine)):
            write_tables("--record", out, engine, fmt, scenario)
        print(f"results in {out}/ ({fmt}); plot them with: simsim plot {out}")
    return 0


def serving_scenario(path: str | None, backend: str | None) -> Scenario:
    """The scenario ``simsim serve`` serves: the file at *path* (which needs no requests)
    or the built-in server, with *backend*'s costs if given; a ``[cluster]`` is served as
    one OpenAI endpoint in front of its router, routed as offline."""
    if path is None:
        scenario = default_serve_scenario()
        if backend is not None:
            scenario = with_backend(scenario, backend)
    else:
        scenario = load_scenario(path, require_requests=False, backend=backend)
    return scenario


def served_as(scenario: Scenario, server: Server) -> str:
    """What serves the requests, for the banner: ``engine SimulationEngine``, or
    ``cluster of 4 replicas, router least_outstanding, engine BatchingEngine`` (the
    engine's class: the full single slot also where the file names the fast one)."""
    engine = type(server_replicas(server)[0]).__name__
    if scenario.cluster is None:
        return f"engine {engine}"
    return f"cluster of {scenario.cluster.describe()}, engine {engine}"


def serve_notes(scenario: Scenario) -> list[str]:
    """What ``simsim serve`` does differently from the file's words, one line each."""
    notes = []
    kind = ENGINE_KINDS.lookup(scenario.engine)
    if not kind.streams_tokens and kind.serves_as is not None:
        notes.append(
            f"simsim: serving engine {kind.serves_as}: {kind.name} has no per-token steps to "
            "stream (same request table)"
        )
    unused = [
        part
        for part, present in (
            ("requests", bool(scenario.requests)),
            ("workload", scenario.workload is not None),
            ("cancellations", bool(scenario.cancellations)),
        )
        if present
    ]
    if unused:
        notes.append(
            f"simsim: ignoring {scenario.source}'s {' and '.join(unused)}: the clients send "
            "the requests"
        )
    if scenario.batching is not None and scenario.batching.prefix_cache:
        notes.append(
            "simsim: note: [prefix_cache] never hits over HTTP: served requests carry no KV "
            "block hashes (prompts are not hashed into blocks yet), so every prompt is "
            "prefilled in full"
        )
    admission = scenario.admission
    if admission is not None and set(admission.limits) - {ANY_OTHER}:
        names = ", ".join(repr(name) for name in admission.limits if name != ANY_OTHER)
        star = (
            f"only the {ANY_OTHER!r} limit does"
            if ANY_OTHER in admission.limits
            else f"only a {ANY_OTHER!r} limit would"
        )
        notes.append(
            f"simsim: note: served requests carry no {admission.key} name, so the admission "
            f"limits for {names} never apply to them ({star})"
        )
    return notes


def _record_folder(value: str | None) -> Path | None:
    """``--record``'s folder, created (after every other option was accepted)."""
    if value is None:
        return None
    try:
        out = output_folder(value)
    except UsageError as error:  # it names --out, the option of 'simsim run'
        raise UsageError("--record", error.rule) from None
    if is_sweep_folder(out):
        raise UsageError(
            "--record", f"{out} holds a sweep (it has sweep.json); give another folder"
        )
    return out


def _raise_terminated(signum: int, frame: Any) -> None:
    raise _Terminated
