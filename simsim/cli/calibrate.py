"""``simsim calibrate``: probe a real server and fit a ``[backend]`` table to it."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Any

import pandas as pd

from simsim.cli.replay import check_url, replay_options
from simsim.cli.shared import (
    ProgressBar,
    install,
)
from simsim.cli.usage import UsageError
from simsim.scenario import (
    load_scenario,
)
from simsim.wording import counted


def execute(args: argparse.Namespace) -> int:
    """Probe ``--url`` (or fit ``--from-probes``) and write the fitted ``[backend]`` table;
    returns the exit status."""
    from simsim.fidelity import calibrate

    if (args.url is None) == (args.from_probes is None):
        raise UsageError("--url", "give either --url (probe a server) or --from-probes")
    out = Path(args.out)
    if out.is_dir():
        raise UsageError("--out", f"{out} is a folder; give the TOML file to write")
    if args.from_probes is not None:
        try:
            probes = calibrate.probes_frame(pd.read_csv(args.from_probes, keep_default_na=False))
        except (OSError, ValueError) as error:
            raise UsageError("--from-probes", f"{args.from_probes}: {error}") from None
        source = None
    else:
        if importlib.util.find_spec("httpx") is None:
            print(f"simsim: error: calibrate needs httpx: {install('fidelity')}", file=sys.stderr)
            return 2
        from simsim.fidelity import replay

        check_url(args.url)
        plan = _calibration_plan(args, calibrate)
        options = replay_options(args)
        print(f"probing {args.url}: {counted(len(plan), 'probe')}", file=sys.stderr)
        try:
            probes = calibrate.run_probes(
                args.url,
                plan,
                model=args.model,
                options=options,
                progress=ProgressBar(sys.stderr, "probing"),
            )
        except replay.ReplayError as error:
            print(f"simsim: error: {error}", file=sys.stderr)
            return 1
        if args.probes_out is not None:
            probes.to_csv(args.probes_out, index=False)
        failed = probes[probes["error"] != ""]
        if len(failed):
            first = failed.iloc[0]
            print(
                f"simsim: warning: {len(failed)} of {counted(len(probes), 'probe request')} "
                "failed "
                f"(left out of the fit); the first: {first['error']}",
                file=sys.stderr,
            )
        source = args.url
    decode = None
    if args.measured:
        decode = pd.concat(
            [_measured_decode(folder, calibrate) for folder in args.measured], ignore_index=True
        )
    try:
        calibration = calibrate.fit_backend(probes, args.engine, decode=decode)
    except ValueError as error:
        print(f"simsim: error: cannot fit: {error}", file=sys.stderr)
        return 1
    print(calibration.report())
    try:
        out.write_text(
            calibrate.backend_toml(calibration, url=source, model=args.model), encoding="utf-8"
        )
    except OSError as error:
        raise UsageError("--out", f"cannot write {out} ({error.strerror})") from None
    print(f"wrote {out}: use it with simsim run SCENARIO --backend {out}")
    return 0


def _measured_decode(folder: str, calibrate: Any) -> pd.DataFrame:
    """The pure decode steps of the measured run in *folder*; a bad folder exits 2."""
    from simsim.run_folder import read_run_folder

    if not Path(folder).is_dir():
        raise UsageError("--measured", f"{folder}: no such folder (simsim replay --out writes one)")
    try:
        run = read_run_folder(folder)
        if not run.measured:
            raise ValueError("it holds a simulation, not a measurement (simsim replay writes one)")
        observations: pd.DataFrame = calibrate.measured_decode_observations(
            run.requests(), run.table("tokens")
        )
        return observations
    except (OSError, ValueError) as error:
        raise UsageError("--measured", f"{folder}: {error}") from None


def _calibration_plan(args: argparse.Namespace, calibrate: Any) -> list[Any]:
    """The probes the flags (and ``--workload``) ask for; a bad list is named (exit 2)."""
    prompts, outputs, levels = [16, 64, 256, 512, 1024], [64], [1]
    if args.engine == "batching":
        levels = [1, 2, 4]
    if args.workload is not None:
        workload = load_scenario(args.workload, require_backend=False)
        try:
            prompts, outputs, slots = calibrate.workload_ranges(workload)
        except ValueError as error:
            raise UsageError("--workload", str(error)) from None
        if args.engine == "batching":
            levels = sorted({level for level in (1, 2, 4, 8, 16, 32) if level <= slots} | {slots})
    prompts = _int_list(args.prompts, "--prompts", prompts)
    outputs = _int_list(args.outputs, "--outputs", outputs)
    levels = _int_list(args.concurrency, "--concurrency", levels)
    if len(set(prompts)) < 2:
        raise UsageError(
            "--prompts",
            f"needs at least two prompt lengths, to see how the prefill grows with the "
            f"prompt; got {prompts}",
        )
    if args.engine == "batching" and len(set(levels)) < 2:
        raise UsageError(
            "--concurrency",
            f"needs at least two levels for a batching server, to tell a step's cost per "
            f"sequence from its base; got {levels}",
        )
    if args.engine == "single_slot" and max(levels) > 1:
        raise UsageError(
            "--concurrency",
            f"sends up to {max(levels)} requests at once, which measures a batching server: "
            "add --engine batching (a single slot is probed one request at a time)",
        )
    too_short = [n for n in outputs if n <= calibrate.GAP_WINDOW]
    if too_short:
        raise UsageError(
            "--outputs",
            f"must be more than {calibrate.GAP_WINDOW} tokens (decode steps are measured "
            f"from the gaps between tokens), got {too_short}",
        )
    try:
        return list(
            calibrate.probe_plan(
                prompts=prompts, outputs=outputs, concurrency=levels, repeats=args.repeats
            )
        )
    except ValueError as error:
        raise UsageError("--repeats", str(error)) from None


def _int_list(value: str | None, flag: str, default: list[int]) -> list[int]:
    if value is None:
        return default
    try:
        numbers = [int(part) for part in value.split(",") if part.strip()]
    except ValueError:
        numbers = []
    if not numbers or min(numbers) < 1:
        raise UsageError(flag, f"must be positive integers separated by commas, got {value!r}")
    return numbers
