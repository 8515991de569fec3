"""Write a small llama-architecture GGUF model with random weights for the reference server.

A transformer's compute does not depend on its weight values, so a random model times
like a trained one of the same shape, and nothing is downloaded. The vocabulary is
synthetic and word-level, so every prompt length is exact:

- id 0 ``<unk>``, 1 ``<s>`` (BOS), 2 ``</s>`` (EOS);
- ids 3 .. 3 + words - 1: the words ``▁w0`` .. ``▁w{words - 1}`` (word *k* is id *k* + 3);
- two helper pieces, ``▁`` and ``▁w``: llama.cpp's SentencePiece tokenizer builds a word
  from its characters by merging pairs whose joined text is in the vocabulary
  (``▁`` + ``w`` -> ``▁w`` -> ``▁w1`` -> ``▁w12``), so text prompts tokenize one word to
  one token too.

A client that needs exact output lengths bans ids 0, 1, 2 and the two helpers with
``logit_bias`` (see ``llama.py``: ``BANNED_TOKEN_IDS``). The file is a function of the
arguments alone: the same arguments write the same bytes.

Run it (it needs the ``gguf`` and ``numpy`` packages; ``setup.sh`` provides them)::

    python benchmarks/fidelity/make_model.py MODEL.gguf [--layers 4 --dim 256 ...]
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

WORD_PIECE = "\u2581"
"""SentencePiece's word-start marker."""


@dataclass(frozen=True)
class ModelShape:
    """The size of the random model; the defaults are the reference benchmark's model."""

    layers: int = 4
    dim: int = 256
    heads: int = 4
    kv_heads: int = 4
    feed_forward: int = 1024
    words: int = 1000
    context_tokens: int = 4096
    f16: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("layers", "dim", "heads", "kv_heads", "feed_forward", "words"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} = {getattr(self, name)}: must be at least 1")
        if self.dim % self.heads or self.heads % self.kv_heads:
            raise ValueError(
                f"dim {self.dim}, heads {self.heads}, kv_heads {self.kv_heads}: dim must be a "
                "multiple of heads, and heads a multiple of kv_heads"
            )
        if self.context_tokens < 16:
            raise ValueError(f"context_tokens = {self.context_tokens}: must be at least 16")

    @property
    def vocab(self) -> list[str]:
        """The tokens in id order (see the module docstring)."""
        words = [f"{WORD_PIECE}w{index}" for index in range(self.words)]
        return ["<unk>", "<s>", "</s>", *words, WORD_PIECE, WORD_PIECE + "w"]

    @property
    def helper_token_ids(self) -> tuple[int, int]:
        """The ids of the two helper pieces, which a generated token should never be."""
        return (self.words + 3, self.words + 4)


def write_model(path: Path, shape: ModelShape) -> None:
    """Write the random-weight model of *shape* to *path* (a GGUF file)."""
    rng = np.random.default_rng(shape.seed)
    weight_type = np.float16 if shape.f16 else np.float32
    head_dim = shape.dim // shape.heads
    vocab = shape.vocab

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("simsim-random-llama")
    writer.add_context_length(shape.context_tokens)
    writer.add_embedding_length(shape.dim)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(shape.feed_forward)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(head_dim)
    writer.add_rope_freq_base(10000.0)
    writer.add_vocab_size(len(vocab))
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if shape.f16 else gguf.LlamaFileType.ALL_F32)

    token_type = gguf.TokenType
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(vocab)
    # The tokenizer merges the highest-scoring pair first: whole words beat the helpers.
    writer.add_token_scores([0.0, 0.0, 0.0] + [-1.0] * shape.words + [-1000.0, -100.0])
    writer.add_token_types(
        [token_type.UNKNOWN, token_type.CONTROL, token_type.CONTROL]
        + [token_type.NORMAL] * (shape.words + 2)
    )
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_add_bos_token(False)  # a token-id prompt is exactly what the client sent
    writer.add_add_eos_token(False)
    writer.add_add_space_prefix(True)  # "w1 w2" -> "▁w1▁w2"

    def matrix(rows: int, columns: int, scale: float | None = None) -> np.ndarray:
        # numpy shape (out, in); the writer reverses it into ggml's order.
        std = 1.0 / np.sqrt(columns) if scale is None else scale
        values = rng.standard_normal((rows, columns), dtype=np.float32) * std
        return values.astype(weight_type)

    def norm() -> np.ndarray:
        return np.ones(shape.dim, dtype=np.float32)  # norms stay F32 in both formats

    kv_dim = shape.kv_heads * head_dim
    writer.add_tensor("token_embd.weight", matrix(len(vocab), shape.dim, scale=1.0))
    for layer in range(shape.layers):
        block = f"blk.{layer}."
        writer.add_tensor(block + "attn_norm.weight", norm())
        writer.add_tensor(block + "attn_q.weight", matrix(shape.dim, shape.dim))
        writer.add_tensor(block + "attn_k.weight", matrix(kv_dim, shape.dim))
        writer.add_tensor(block + "attn_v.weight", matrix(kv_dim, shape.dim))
        writer.add_tensor(block + "attn_output.weight", matrix(shape.dim, shape.dim))
        writer.add_tensor(block + "ffn_norm.weight", norm())
        writer.add_tensor(block + "ffn_gate.weight", matrix(shape.feed_forward, shape.dim))
        writer.add_tensor(block + "ffn_up.weight", matrix(shape.feed_forward, shape.dim))
        writer.add_tensor(block + "ffn_down.weight", matrix(shape.dim, shape.feed_forward))
    writer.add_tensor("output_norm.weight", norm())
    writer.add_tensor("output.weight", matrix(len(vocab), shape.dim))

    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def main(argv: Sequence[str] | None = None) -> None:
    """Parse the command line and write the model."""
    default = ModelShape()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="the GGUF file to write")
    parser.add_argument("--layers", type=int, default=default.layers)
    parser.add_argument("--dim", type=int, default=default.dim, help="embedding width")
    parser.add_argument("--heads", type=int, default=default.heads)
    parser.add_argument("--kv-heads", type=int, default=None, help="default: --heads")
    parser.add_argument("--ff", type=int, default=None, help="feed-forward width (4 x dim)")
    parser.add_argument("--words", type=int, default=default.words)
    parser.add_argument(
        "--ctx", type=int, default=default.context_tokens, help="the model's context length"
    )
    parser.add_argument("--f16", action="store_true", help="F16 matrices (default F32)")
    parser.add_argument("--seed", type=int, default=default.seed)
    args = parser.parse_args(argv)
    try:
        shape = ModelShape(
            layers=args.layers,
            dim=args.dim,
            heads=args.heads,
            kv_heads=args.heads if args.kv_heads is None else args.kv_heads,
            feed_forward=4 * args.dim if args.ff is None else args.ff,
            words=args.words,
            context_tokens=args.ctx,
            f16=args.f16,
            seed=args.seed,
        )
    except ValueError as error:
        parser.error(str(error))
    write_model(args.out, shape)
    print(
        f"wrote {args.out}: {shape.layers} layers, dim {shape.dim}, heads "
        f"{shape.heads}/{shape.kv_heads}, ff {shape.feed_forward}, vocab {len(shape.vocab)}, "
        f"context {shape.context_tokens}, {'F16' if shape.f16 else 'F32'}, seed {shape.seed}"
    )


if __name__ == "__main__":
    main()
