"""Model architectures: what a transformer holds and computes, read from a ``config.json``.

:class:`ModelSpec` is a model's shape (layers, widths, heads, experts, precisions) and the
figures a cost model derives from it: parameters, weight bytes, KV-cache bytes per token,
FLOPs per token. :func:`load_model` finds one by Hugging Face id among the bundled presets
(:data:`MODELS`, ``simsim/data/models.json``) or reads a local ``config.json``; nothing is
ever downloaded.

Every MLP is assumed gated (SwiGLU: gate, up and down projections, three matrices of
``hidden x width``), as in every Llama, Qwen, Mistral and Mixtral model. Norms, biases
and rotary tables are left out of the parameter count: they are well under 0.1% of any
preset and are never a matmul.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from simsim.checks import check_choice, closest

__all__ = ["MODELS", "ModelConfigError", "ModelSpec", "load_model"]

_PRECISION_BYTES = {"bf16": 2.0, "fp16": 2.0, "fp8": 1.0}
_KV_CACHE_BYTES = {"auto": None, "fp8": 1.0}

# torch_dtype -> bytes per weight as vLLM serves it. vLLM's dtype="auto" serves an FP32
# checkpoint in 16 bits, so float32 counts 2 bytes too.
_DTYPE_BYTES = {"bfloat16": 2.0, "float16": 2.0, "half": 2.0, "float32": 2.0, "float": 2.0}


class ModelConfigError(ValueError):
    """A ``config.json`` (or preset) that simsim cannot read as a model: a missing or
    wrong field, an unsupported quantization; the message names the field and the model."""


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A decoder-only transformer's shape and precisions (see the module docstring).

    ``intermediate_size`` is the dense MLP width, or for a mixture-of-experts model the
    width of one expert; ``dense_intermediate_size`` is the MLP width of the layers that
    are not MoE (equal to ``intermediate_size`` for a dense model). ``moe_layers`` counts
    the MoE layers (all of them for Mixtral and Qwen3-MoE; Llama 4 interleaves them).
    ``shared_expert_intermediate_size`` is the width of an expert every token goes
    through (0 if none). ``weight_bytes_per_param`` is 2.0 for BF16/FP16 and 1.0 for FP8;
    ``kv_bytes_per_element`` is 2.0, or 1.0 for an FP8 KV cache.
    """

    name: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    num_experts: int
    experts_per_token: int
    shared_expert_intermediate_size: int
    moe_layers: int
    dense_intermediate_size: int
    tie_word_embeddings: bool
    max_position_embeddings: int
    weight_bytes_per_param: float
    kv_bytes_per_element: float

    @property
    def is_moe(self) -> bool:
        """True when the model has routed experts (``num_experts > 0``)."""
        return self.num_experts > 0

    @property
    def attention_params_per_layer(self) -> int:
        """q + k + v + o projections of one layer:
        ``hidden*heads*head_dim + 2*hidden*kv_heads*head_dim + heads*head_dim*hidden``."""
        q = self.hidden_size * self.num_heads * self.head_dim
        kv = 2 * self.hidden_size * self.num_kv_heads * self.head_dim
        return q + kv + self.num_heads * self.head_dim * self.hidden_size

    @property
    def mlp_params_per_dense_layer(self) -> int:
        """One gated MLP of a non-MoE layer: ``3 * hidden * dense_intermediate_size``."""
        return 3 * self.hidden_size * self.dense_intermediate_size

    @property
    def params_per_expert(self) -> int:
        """One routed expert (a gated MLP): ``3 * hidden * intermediate_size``."""
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def shared_expert_params_per_layer(self) -> int:
        """The shared expert of one MoE layer: ``3 * hidden * shared_expert_intermediate_size``."""
        return 3 * self.hidden_size * self.shared_expert_intermediate_size

    @property
    def router_params_per_layer(self) -> int:
        """The router (gate) of one MoE layer: ``hidden * num_experts`` (0 for dense)."""
        return self.hidden_size * self.num_experts

    @property
    def embedding_params(self) -> int:
        """The token embedding table: ``vocab * hidden``."""
        return self.vocab_size * self.hidden_size

    @property
    def lm_head_params(self) -> int:
        """The output projection: ``vocab * hidden``, or 0 when tied to the embedding."""
        return 0 if self.tie_word_embeddings else self.vocab_size * self.hidden_size

    @property
    def _dense_layers(self) -> int:
        return self.num_layers - self.moe_layers

    @property
    def params_total(self) -> int:
        """Every weight: ``layers * attention + dense_layers * dense MLP + moe_layers *
        (num_experts * expert + shared expert + router) + embedding + lm head``."""
        moe = (
            self.num_experts * self.params_per_expert
            + self.shared_expert_params_per_layer
            + self.router_params_per_layer
        )
        return (
            self.num_layers * self.attention_params_per_layer
            + self._dense_layers * self.mlp_params_per_dense_layer
            + self.moe_layers * moe
            + self.embedding_params
            + self.lm_head_params
        )

    @property
    def params_active_per_token(self) -> int:
        """The weights one token multiplies by: ``layers * attention + dense_layers * dense
        MLP + moe_layers * (experts_per_token * expert + shared expert) + lm head``. The
        embedding lookup is not a matmul and the router is left out (it is tiny)."""
        moe = self.experts_per_token * self.params_per_expert + self.shared_expert_params_per_layer
        return (
            self.num_layers * self.attention_params_per_layer
            + self._dense_layers * self.mlp_params_per_dense_layer
            + self.moe_layers * moe
            + self.lm_head_params
        )

    @property
    def weight_bytes(self) -> int:
        """All weights in bytes: ``int(params_total * weight_bytes_per_param)``."""
        return int(self.params_total * self.weight_bytes_per_param)

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache of one token, all layers: ``2 * layers * kv_heads * head_dim *
        kv_bytes_per_element`` (a key and a value per KV head per layer)."""
        return int(
            2 * self.num_layers * self.num_kv_heads * self.head_dim * self.kv_bytes_per_element
        )

    @property
    def flops_per_token(self) -> int:
        """The linear layers' FLOPs for one token: ``2 * params_active_per_token`` (a
        multiply and an add per weight). Attention's own FLOPs: :meth:`attention_flops`."""
        return 2 * self.params_active_per_token

    def attention_flops(self, new_tokens: int, cached_tokens: int) -> int:
        """Score and value FLOPs of a sequence's step: *new_tokens* attend to the
        *cached_tokens* already in the cache and causally to each other:
        ``4 * layers * heads * head_dim * (new * cached + new * (new + 1) / 2)``
        (``QK^T`` and ``PV``, 2 FLOPs per multiply-add each)."""
        pairs = new_tokens * cached_tokens + new_tokens * (new_tokens + 1) // 2
        return 4 * self.num_layers * self.num_heads * self.head_dim * pairs

    @classmethod
    def from_config(cls, config: Mapping[str, Any], name: str) -> ModelSpec:
        """A spec from a Hugging Face ``config.json`` dict; *name* names the model in errors.

        Reads a nested ``text_config`` (Llama 4, multimodal models), Mixtral's
        ``num_local_experts``/``num_experts_per_tok``, Qwen-MoE's ``num_experts``,
        ``moe_intermediate_size``, ``shared_expert_intermediate_size``,
        ``decoder_sparse_step`` and ``mlp_only_layers``, Llama 4's
        ``intermediate_size_mlp`` and ``interleave_moe_layer_step`` (with a shared expert
        of ``intermediate_size``), an explicit ``head_dim``, ``torch_dtype`` (or
        ``dtype``) and a ``quantization_config`` (or ``quantization_config_summary``) whose
        weights are 8-bit floats (FP8). Absent ``num_key_value_heads`` means one KV head
        per head; absent ``tie_word_embeddings`` means untied. A missing needed field, an
        unsupported quantization or an architecture simsim does not model (DeepSeek's MLA
        attention and experts) raises :class:`ModelConfigError` naming it.
        """
        if not isinstance(config, Mapping):
            raise ModelConfigError(f"{name}: a config must be a mapping, got {type(config)}")
        fields = dict(config)
        text = config.get("text_config")
        if isinstance(text, Mapping):
            # Outer fields (dtype, quantization) are defaults; the text model's win.
            fields = {**{k: v for k, v in config.items() if k != "text_config"}, **text}

        for key, what in (("kv_lora_rank", "MLA attention"), ("n_routed_experts", "DeepSeek MoE")):
            if key in fields:
                raise ModelConfigError(f"{name}: {what} ({key!r}) is not modelled by simsim")

        def need(key: str) -> int:
            if key not in fields or fields[key] is None:
                raise ModelConfigError(f"{name}: config has no {key!r}, which simsim needs")
            return _positive(fields[key], key, name)

        num_layers = need("num_hidden_layers")
        hidden = need("hidden_size")
        heads = need("num_attention_heads")
        width = need("intermediate_size")
        vocab = need("vocab_size")
        kv_heads = fields.get("num_key_value_heads")
        kv_heads = heads if kv_heads is None else _positive(kv_heads, "num_key_value_heads", name)
        head_dim = fields.get("head_dim")
        head_dim = hidden // heads if head_dim is None else _positive(head_dim, "head_dim", name)
        if head_dim == 0:
            raise ModelConfigError(f"{name}: hidden_size {hidden} < num_attention_heads {heads}")

        experts = fields.get("num_local_experts", fields.get("num_experts")) or 0
        experts = _count(experts, "num_experts", name)
        per_token = _count(fields.get("num_experts_per_tok") or 0, "num_experts_per_tok", name)
        if experts and not per_token:
            raise ModelConfigError(
                f"{name}: config has {experts} experts but no 'num_experts_per_tok'"
            )
        expert_width, dense_width, shared, moe_layers = width, width, 0, 0
        if experts:
            moe_width = fields.get("moe_intermediate_size")
            if moe_width is not None:  # Qwen-MoE: intermediate_size is the dense MLP's
                expert_width = _positive(moe_width, "moe_intermediate_size", name)
            if "intermediate_size_mlp" in fields:  # Llama 4: a shared expert per MoE layer
                dense_width = _positive(
                    fields["intermediate_size_mlp"], "intermediate_size_mlp", name
                )
                shared = width
            shared = _count(
                fields.get("shared_expert_intermediate_size") or shared,
                "shared_expert_intermediate_size",
                name,
            )
            moe_layers = _moe_layer_count(fields, num_layers, name)

        return cls(
            name=name,
            num_layers=num_layers,
            hidden_size=hidden,
            num_heads=heads,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            intermediate_size=expert_width,
            vocab_size=vocab,
            num_experts=experts,
            experts_per_token=per_token,
            shared_expert_intermediate_size=shared,
            moe_layers=moe_layers,
            dense_intermediate_size=dense_width,
            tie_word_embeddings=bool(fields.get("tie_word_embeddings", False)),
            max_position_embeddings=_count(
                fields.get("max_position_embeddings") or 0, "max_position_embeddings", name
            ),
            weight_bytes_per_param=_weight_bytes(fields, name),
            kv_bytes_per_element=2.0,
        )


def _positive(value: object, key: str, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ModelConfigError(f"{name}: {key} must be a positive integer, got {value!r}")
    return value


def _count(value: object, key: str, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ModelConfigError(f"{name}: {key} must be an integer >= 0, got {value!r}")
    return value


def _moe_layer_count(fields: Mapping[str, Any], num_layers: int, name: str) -> int:
    """How many layers route to experts: layer ``i`` (from 0) is MoE when ``(i + 1) % step
    == 0`` for Llama 4's ``interleave_moe_layer_step`` or Qwen's ``decoder_sparse_step``
    (default 1: every layer), unless Qwen's ``mlp_only_layers`` lists it."""
    step = fields.get("interleave_moe_layer_step", fields.get("decoder_sparse_step", 1)) or 1
    step = _positive(step, "the MoE layer step", name)
    dense_only = set(fields.get("mlp_only_layers") or ())
    return sum(1 for i in range(num_layers) if (i + 1) % step == 0 and i not in dense_only)


def _weight_bytes(fields: Mapping[str, Any], name: str) -> float:
    quant = fields.get("quantization_config") or fields.get("quantization_config_summary")
    if isinstance(quant, Mapping):
        if _is_fp8(quant):
            return 1.0
        method = quant.get("quant_method", "unknown")
        raise ModelConfigError(
            f"{name}: quantization {method!r} is not supported "
            "(simsim models BF16/FP16 weights and FP8 weights)"
        )
    dtype = fields.get("torch_dtype", fields.get("dtype", "bfloat16"))
    if dtype is None:
        return 2.0
    if dtype not in _DTYPE_BYTES:
        raise ModelConfigError(
            f"{name}: torch_dtype {dtype!r} is not one simsim knows "
            f"({', '.join(sorted(_DTYPE_BYTES))})"
        )
    return _DTYPE_BYTES[dtype]


def _is_fp8(quant: Mapping[str, Any]) -> bool:
    """An FP8-weight quantization: ``quant_method = "fp8"``, or a compressed-tensors scheme
    (top-level or in ``config_groups``) whose weights are 8-bit floats."""
    if quant.get("quant_method") == "fp8":
        return True
    schemes = [quant]
    groups = quant.get("config_groups")
    if isinstance(groups, Mapping):
        schemes += [g for g in groups.values() if isinstance(g, Mapping)]
    weights = [s.get("weights") for s in schemes]
    return any(
        isinstance(w, Mapping) and w.get("num_bits") == 8 and w.get("type") == "float"
        for w in weights
    )


@cache
def _presets() -> dict[str, dict[str, Any]]:
    text = resources.files("simsim").joinpath("data/models.json").read_text(encoding="utf-8")
    presets: dict[str, dict[str, Any]] = json.loads(text)
    return presets


MODELS: tuple[str, ...] = tuple(_presets())
"""The bundled model presets, by Hugging Face id (``simsim/data/models.json``)."""


def load_model(
    source: str | os.PathLike[str],
    *,
    precision: str | None = None,
    kv_cache_dtype: str | None = None,
) -> ModelSpec:
    """A model by Hugging Face id (a bundled preset, matched case-insensitively) or by the
    path of a local ``config.json`` or of a directory holding one. Never downloads.

    *precision* (``"bf16"``, ``"fp16"``, ``"fp8"``) overrides the weight bytes the config
    implies; *kv_cache_dtype* ``"fp8"`` stores the KV cache in one byte per element
    (``"auto"``: as the weights' activations, 2 bytes). An unknown name raises
    :class:`ModelConfigError` with a did-you-mean.
    """
    if precision is not None:
        check_choice(precision, "precision", _PRECISION_BYTES, known="precisions")
    if kv_cache_dtype is not None:
        check_choice(kv_cache_dtype, "kv_cache_dtype", _KV_CACHE_BYTES, known="KV cache dtypes")
    spec = _load(source)
    if precision is not None:
        spec = replace(spec, weight_bytes_per_param=_PRECISION_BYTES[precision])
    kv_bytes = _KV_CACHE_BYTES.get(kv_cache_dtype or "auto")
    if kv_bytes is not None:
        spec = replace(spec, kv_bytes_per_element=kv_bytes)
    return spec


def _load(source: str | os.PathLike[str]) -> ModelSpec:
    if not isinstance(source, str | os.PathLike):
        raise TypeError(f"a model must be a name or a path, got {type(source).__name__}")
    text = os.fspath(source)
    by_lower = {name.lower(): name for name in _presets()}
    if isinstance(source, str) and text.lower() in by_lower:
        name = by_lower[text.lower()]
        return ModelSpec.from_config(_presets()[name], name)
    path = Path(text)
    if path.is_dir():
        path = path / "config.json"
        if not path.is_file():
            raise ModelConfigError(f"model folder {text!r} has no config.json")
    if path.is_file():
        try:
            config = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as error:
            raise ModelConfigError(f"{path}: not a readable JSON config ({error})") from None
        return ModelSpec.from_config(config, str(path))
    if path.suffix == ".json" or not isinstance(source, str):
        raise ModelConfigError(f"model config {text!r} does not exist")
    raise ModelConfigError(
        f"unknown model {text!r}{_guess(text, by_lower)}; give a bundled preset "
        "(simsim.gpu.MODELS) or the path of a config.json"
    )


def _guess(text: str, by_lower: Mapping[str, str]) -> str:
    """A did-you-mean on lower case, then on the part after the organisation, so
    ``llama-3.1-8b-instruct`` finds ``meta-llama/Llama-3.1-8B-Instruct``."""
    guess = closest(text.lower(), by_lower)
    if guess is None:
        tails = {name.split("/")[-1]: name for name in by_lower}
        tail = closest(text.lower().split("/")[-1], tails)
        guess = None if tail is None else tails[tail]
    return "" if guess is None else f" (did you mean {by_lower[guess]!r}?)"
