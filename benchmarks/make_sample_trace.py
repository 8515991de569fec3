"""Write simsim's synthetic sample traces: Azure LLM inference format, and Mooncake.

The file ``simsim/data/sample_azure_trace.csv`` is made here, from a seed, not
downloaded: 200 requests whose arrivals form a bursty renewal process (Gamma gaps with a
coefficient of variation of 3 around one request per second) and whose prompt and
output lengths are log-normal. Timestamps carry seven fractional digits (100 ns), as in
the real traces, so that reading them exercises the rounding rule.

``simsim/data/sample_mooncake_trace.jsonl`` (Mooncake's JSON lines): conversations of a
few turns, each turn's prompt being the previous turn's prompt and answer plus new user
tokens (so its ``hash_ids`` extend the previous turn's), every conversation opening with
one of two shared system prompts; blocks of 512 tokens, new blocks' ids counting up,
timestamps in milliseconds. The committed files must equal what this script writes; the
test suite checks that.

Run it:  python benchmarks/make_sample_trace.py            (rewrites the file)
         python benchmarks/make_sample_trace.py --check    (exit status 1 if it differs)
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import sys
from pathlib import Path

import numpy as np

from simsim.workloads import LogNormal

SEED = 20231116
ROWS = 200
RATE_PER_S = 1.0
GAP_CV = 3.0
START = datetime.datetime(2023, 11, 16, 18, 15, 46)
START_FRACTION_TICKS = 6_805_900  # in units of 100 ns: the trace starts at ...:46.6805900
TICKS_PER_S = 10_000_000
PROMPT_TOKENS = LogNormal(mean=1_200, cv=1.2, low=2, high=8_192)
OUTPUT_TOKENS = LogNormal(mean=220, cv=1.0, low=1, high=2_000)
DEFAULT_OUT = Path(__file__).resolve().parent.parent / "simsim" / "data" / "sample_azure_trace.csv"


def render(seed: int = SEED) -> str:
    """The whole CSV text of the sample trace for *seed* (``\\n`` line endings)."""
    arrival_seed, prompt_seed, output_seed = np.random.SeedSequence(seed).spawn(3)
    shape = 1.0 / GAP_CV**2
    gaps_s = np.random.default_rng(arrival_seed).gamma(shape, 1.0 / RATE_PER_S / shape, ROWS - 1)
    offsets = np.concatenate(([0], np.rint(np.cumsum(gaps_s) * TICKS_PER_S).astype(np.int64)))
    prompts = PROMPT_TOKENS.sample(np.random.default_rng(prompt_seed), ROWS)
    outputs = OUTPUT_TOKENS.sample(np.random.default_rng(output_seed), ROWS)
    out = io.StringIO()
    out.write("TIMESTAMP,ContextTokens,GeneratedTokens\n")
    for offset, prompt, output in zip(
        offsets.tolist(), prompts.tolist(), outputs.tolist(), strict=True
    ):
        ticks = START_FRACTION_TICKS + offset
        moment = START + datetime.timedelta(seconds=ticks // TICKS_PER_S)
        out.write(f"{moment:%Y-%m-%d %H:%M:%S}.{ticks % TICKS_PER_S:07d},{prompt},{output}\n")
    return out.getvalue()


MOONCAKE_SEED = 20240701
CONVERSATIONS = 24
BLOCK = 512
SYSTEM_PROMPTS = (2 * BLOCK, 3 * BLOCK)  # two shared system prompts, in tokens
MOONCAKE_OUT = (
    Path(__file__).resolve().parent.parent / "simsim" / "data" / "sample_mooncake_trace.jsonl"
)


def render_mooncake(seed: int = MOONCAKE_SEED) -> str:
    """The whole JSON-lines text of the sample Mooncake trace for *seed*."""
    rng = np.random.default_rng(seed)
    next_id = 0
    system_ids = []
    for tokens in SYSTEM_PROMPTS:
        system_ids.append(list(range(next_id, next_id + tokens // BLOCK)))
        next_id += tokens // BLOCK
    rows = []
    for _ in range(CONVERSATIONS):
        group = int(rng.integers(len(SYSTEM_PROMPTS)))
        ids = list(system_ids[group])
        prompt = SYSTEM_PROMPTS[group]
        start_ms = int(rng.integers(0, 60_000))
        at_ms = start_ms
        for _turn in range(int(rng.integers(2, 6))):
            prompt += int(rng.integers(50, 900))  # the user's new message
            full = prompt // BLOCK
            # Blocks past the shared ones are new: this conversation's own history.
            while len(ids) < -(-prompt // BLOCK):
                ids.append(next_id)
                next_id += 1
            output = int(rng.integers(20, 400))
            rows.append(
                {
                    "timestamp": at_ms,
                    "input_length": prompt,
                    "output_length": output,
                    "hash_ids": ids[: -(-prompt // BLOCK)],
                }
            )
            # The partial last block changes as the conversation grows: a new id.
            if prompt % BLOCK:
                ids = ids[:full]
            prompt += output
            at_ms += int(rng.integers(2_000, 20_000))  # the user reads and types
    rows.sort(key=lambda row: row["timestamp"])
    return "".join(json.dumps(row, separators=(", ", ": ")) + "\n" for row in rows)


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check``, compare) the sample traces; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the Azure sample")
    parser.add_argument(
        "--mooncake-out", type=Path, default=MOONCAKE_OUT, help="the Mooncake sample"
    )
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    status = 0
    for path, text in ((args.out, render()), (args.mooncake_out, render_mooncake())):
        if args.check:
            current = path.read_text(encoding="utf-8") if path.exists() else None
            if current != text:
                print(f"{path} differs from what {Path(__file__).name} writes", file=sys.stderr)
                status = 1
            else:
                print(f"{path} is up to date")
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8", newline="\n")
        print(f"wrote {text.count(chr(10))} lines to {path}")
    return status


if __name__ == "__main__":
    sys.exit(main())
