"""Write simsim's synthetic sample trace in the Azure LLM inference trace format.

The file ``simsim/data/sample_azure_trace.csv`` is made here, from a seed, not
downloaded: 200 requests whose arrivals form a bursty renewal process (Gamma gaps with a
coefficient of variation of 3 around one request per second) and whose prompt and
output lengths are log-normal. Timestamps carry seven fractional digits (100 ns), as in
the real traces, so that reading them exercises the rounding rule. The committed file
must equal what this script writes; the test suite checks that.

Run it:  python benchmarks/make_sample_trace.py            (rewrites the file)
         python benchmarks/make_sample_trace.py --check    (exit status 1 if it differs)
"""

from __future__ import annotations

import argparse
import datetime
import io
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


def main(argv: list[str] | None = None) -> int:
    """Write (or with ``--check``, compare) the sample trace; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to write")
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        current = args.out.read_text(encoding="utf-8") if args.out.exists() else None
        if current != text:
            print(f"{args.out} differs from what {Path(__file__).name} writes", file=sys.stderr)
            return 1
        print(f"{args.out} is up to date")
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text, encoding="utf-8", newline="\n")
    print(f"wrote {ROWS} rows to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
