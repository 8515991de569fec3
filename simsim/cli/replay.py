"""``simsim replay``: play a scenario's requests against a real server and measure."""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from typing import TYPE_CHECKING

from simsim.cli.shared import (
    ProgressBar,
    check_seed,
    install,
    run_output_folder,
)
from simsim.cli.usage import UsageError
from simsim.scenario import (
    load_scenario,
)

if TYPE_CHECKING:
    from simsim.fidelity.replay import ReplayOptions


def execute(args: argparse.Namespace) -> int:
    """Play the scenario's requests against ``--url`` and write what was measured;
    returns the exit status."""
    if importlib.util.find_spec("httpx") is None:
        print(f"simsim: error: replay needs httpx: {install('fidelity')}", file=sys.stderr)
        return 2
    from simsim.fidelity import replay

    check_seed(args.seed)
    # The server measured is the cost model: the file needs no [backend] table.
    scenario = load_scenario(args.scenario, seed=args.seed, require_backend=False)
    replay.planned_requests(scenario)  # a closed-loop workload is refused before anything
    options = replay_options(args)
    check_url(args.url)
    out = run_output_folder(args)
    if out is None:
        return 2
    try:
        run = replay.replay_scenario(
            scenario,
            args.url,
            model=args.model,
            options=options,
            progress=ProgressBar(sys.stderr, "replaying"),
        )
    except replay.ReplayError as error:
        print(f"simsim: error: {error}", file=sys.stderr)
        return 1
    try:
        run.write(out, format=args.format)
    except OSError as error:
        raise UsageError("--out", f"cannot write {error.filename or out}") from None
    print(replay.replay_report(run))
    print(f"results in {out}/ ({args.format}): requests, tokens, summary, run.json")
    return 1 if (run.requests["state"] == "FAILED").any() else 0


def check_url(url: str) -> None:
    """*url* as a server's root, or exit 2 naming ``--url`` (needs httpx: checked first)."""
    from simsim.fidelity.replay import server_root

    try:
        server_root(url)
    except ValueError as error:
        raise UsageError("--url", str(error)) from None


def replay_options(args: argparse.Namespace) -> ReplayOptions:
    """The ``ReplayOptions`` the replay flags ask for; a bad flag is named (exit 2)."""
    from simsim.fidelity.replay import ReplayOptionError, ReplayOptions

    low, _, high = args.token_ids.partition("-")
    try:
        token_ids = (int(low), int(high))
    except ValueError:
        raise UsageError(
            "--token-ids", f"must be LOW-HIGH, two token ids, got {args.token_ids!r}"
        ) from None
    try:
        bans = tuple(int(part) for part in args.ban_tokens.split(",") if part.strip())
    except ValueError:
        raise UsageError(
            "--ban-tokens", f"must be comma-separated token ids, got {args.ban_tokens!r}"
        ) from None
    try:
        extra = json.loads(args.extra_body)
    except ValueError as error:
        raise UsageError("--extra-body", f"is not JSON ({error})") from None
    flags = {
        "token_ids": "--token-ids",
        "prompt_seed": "--prompt-seed",
        "ban_tokens": "--ban-tokens",
        "extra_body": "--extra-body",
        "timeout_s": "--timeout",
    }
    try:
        return ReplayOptions(
            token_ids=token_ids,
            prompt_seed=args.prompt_seed,
            ban_tokens=bans,
            extra_body=extra,
            timeout_s=args.timeout,
            exact_output=not args.no_exact_output,
        )
    except ReplayOptionError as error:  # it names its field; the user typed the flag
        raise UsageError(flags.get(error.field, error.field), error.rule) from None
