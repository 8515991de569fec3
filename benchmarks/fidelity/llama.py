"""Start and stop the reference llama-server, and the request options it needs.

``llama_server(model)`` is a context manager: it starts llama.cpp's ``llama-server`` on
127.0.0.1 on a free port with one thread, waits until ``/health`` answers, yields the
base URL (``http://127.0.0.1:PORT``) and always stops the server when the block ends,
also when it ends with an exception::

    from llama import llama_server, model_path
    with llama_server(model_path(), parallel=4) as url:
        ...  # POST url + "/v1/completions" with REQUEST_EXTRAS in the body

``REQUEST_EXTRAS`` is what every request body adds so that the server generates exactly
``max_tokens`` tokens, one streamed chunk each, and recomputes every prompt: the
pipeline passes it to ``simsim replay`` and ``simsim calibrate`` as ``--extra-body``.

Paths come from the cache that ``setup.sh`` fills: ``${SIMSIM_LLAMA_CACHE:-
~/.cache/simsim/llama}``. Only the standard library is used, so this module imports
anywhere.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

DEFAULT_CACHE = Path.home() / ".cache" / "simsim" / "llama"
"""Where ``setup.sh`` puts the server and the model unless ``SIMSIM_LLAMA_CACHE`` says."""

CONTEXT_TOKENS_PER_SLOT = 4096
"""Each slot's KV context (prompt + output must fit in it; see ``llama_server``)."""

WORDS = 1000
"""The model's words: ids 3 .. 1002 (``make_model.py``); a prompt uses only these ids."""

PROMPT_TOKEN_IDS = range(3, 3 + WORDS)
"""The token ids a prompt may contain: the words, never a control or helper token."""

BANNED_TOKEN_IDS = (0, 1, 2, 3 + WORDS, 4 + WORDS)
"""``<unk>``, ``<s>``, ``</s>`` and the two helper pieces: banned from the output.

A random model samples them now and then; they still count as tokens but stream as
empty chunks (and ``</s>`` would end the stream early without ``ignore_eos``).
"""

REQUEST_EXTRAS: dict[str, Any] = {
    "ignore_eos": True,
    "cache_prompt": False,
    "logit_bias": {str(token_id): False for token_id in BANNED_TOKEN_IDS},
}
"""Body keys for llama-server's ``/v1/completions``: exactly ``max_tokens`` non-empty
chunks (no end of sequence, no control token: ``false`` bans a token), and no reuse of a
previous prompt's KV cache, so every prefill computes the whole prompt."""


def cache_dir() -> Path:
    """The cache folder: ``$SIMSIM_LLAMA_CACHE`` or ``~/.cache/simsim/llama``."""
    configured = os.environ.get("SIMSIM_LLAMA_CACHE")
    return Path(configured) if configured else DEFAULT_CACHE


def server_binary(cache: Path | None = None) -> Path:
    """The llama-server executable ``setup.sh`` installs in the cache."""
    return (cache or cache_dir()) / "bin" / "llama-server"


def model_path(cache: Path | None = None) -> Path:
    """The random-weight model ``setup.sh`` writes in the cache."""
    return (cache or cache_dir()) / "model.gguf"


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def server_command(
    binary: Path,
    model: Path,
    port: int,
    *,
    parallel: int,
    threads: int,
    context_tokens_per_slot: int,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The llama-server command line; the total context is split evenly over the slots."""
    return [
        str(binary),
        "--model",
        str(model),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--threads",
        str(threads),
        "--threads-batch",
        str(threads),
        "--parallel",
        str(parallel),
        "--ctx-size",
        str(parallel * context_tokens_per_slot),
        "--cache-ram",
        "0",  # no host-memory prompt cache: every request is computed from scratch
        "--no-webui",
        *extra_args,
    ]


@contextmanager
def llama_server(
    model: Path | str,
    parallel: int = 1,
    threads: int = 1,
    *,
    context_tokens_per_slot: int = CONTEXT_TOKENS_PER_SLOT,
    binary: Path | str | None = None,
    extra_args: Sequence[str] = (),
    log_path: Path | str | None = None,
    startup_timeout_s: float = 60.0,
    warm_up: bool = True,
) -> Iterator[str]:
    """Run llama-server for the duration of a with-block and yield its base URL.

    *parallel* is the number of slots (``--parallel``: 1 serves one request at a time,
    more batch continuously); each slot gets *context_tokens_per_slot* tokens of KV
    context, and a request whose prompt plus output exceeds it is cut short by the
    server. The server's output goes to *log_path* (default: a temporary file, deleted
    afterwards); when the server does not become healthy within *startup_timeout_s*,
    the error quotes the end of that log. With *warm_up*, one short completion is
    sent before the URL is yielded: a fresh server's first request is slower (about
    20 ms more here), which no workload should pay. The server is always stopped:
    terminated, then killed if it has not exited after 5 s.
    """
    if parallel < 1 or threads < 1 or context_tokens_per_slot < 1:
        raise ValueError(
            f"parallel = {parallel}, threads = {threads}, context_tokens_per_slot = "
            f"{context_tokens_per_slot}: each must be at least 1"
        )
    executable = Path(binary) if binary is not None else server_binary()
    model = Path(model)
    for what, path in (("llama-server binary", executable), ("model", model)):
        if not path.is_file():
            raise FileNotFoundError(
                f"no {what} at {path}: run benchmarks/fidelity/setup.sh first "
                "(or set SIMSIM_LLAMA_CACHE to the cache it filled)"
            )
    environment = dict(os.environ)
    # A shared-library build keeps its libraries beside the binary (setup.sh copies them).
    library_path = environment.get("LD_LIBRARY_PATH")
    environment["LD_LIBRARY_PATH"] = str(executable.parent) + (
        f":{library_path}" if library_path else ""
    )
    with tempfile.TemporaryDirectory(prefix="simsim-llama-") as scratch:
        log_file = Path(log_path) if log_path is not None else Path(scratch) / "server.log"
        port = free_port()
        command = server_command(
            executable,
            model,
            port,
            parallel=parallel,
            threads=threads,
            context_tokens_per_slot=context_tokens_per_slot,
            extra_args=extra_args,
        )
        Path(log_file).parent.mkdir(parents=True, exist_ok=True)
        with open(log_file, "wb") as log:
            process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=environment
            )
        try:
            url = f"http://127.0.0.1:{port}"
            _wait_until_healthy(url, process, log_file, startup_timeout_s)
            if warm_up:
                _complete(url, prompt=list(PROMPT_TOKEN_IDS[:8]), max_tokens=4)
            yield url
        finally:
            _stop(process)


def _wait_until_healthy(
    url: str, process: subprocess.Popen[bytes], log_file: Path, timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        if process.poll() is not None:
            raise RuntimeError(
                f"llama-server exited with status {process.returncode} before {url}/health "
                f"answered; the end of its log:\n{_tail(log_file)}"
            )
        try:
            with urllib.request.urlopen(url + "/health", timeout=1.0) as response:
                if response.status == 200 and json.load(response).get("status") == "ok":
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
            pass  # not listening yet, or 503 while the model loads
        if time.monotonic() > deadline:
            raise TimeoutError(
                f"llama-server at {url} was not healthy after {timeout_s:g} s; the end of "
                f"its log:\n{_tail(log_file)}"
            )
        time.sleep(0.05)


def _complete(url: str, *, prompt: list[int], max_tokens: int) -> dict[str, Any]:
    """One non-streamed completion with ``REQUEST_EXTRAS``; the decoded response."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": False, **REQUEST_EXTRAS}
    request = urllib.request.Request(
        url + "/v1/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60.0) as response:
        answer: dict[str, Any] = json.load(response)
        return answer


def _stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _tail(path: Path, lines: int = 20) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError as error:
        return f"(unreadable: {error})"
    return "\n".join(text.splitlines()[-lines:])
