"""Model architectures (issue 26, point 1): presets, config.json, derived figures, errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from simsim.gpu import MODELS, ModelConfigError, ModelSpec, load_model

DATA = Path(__file__).parent / "data"
REFERENCE = json.loads((DATA / "vllm_reference_models.json").read_text())


def test_llama_2_7b_parameters_and_kv_bytes_by_hand() -> None:
    model = load_model("meta-llama/Llama-2-7b-hf")
    attention = 4 * 4096 * 4096  # 32 KV heads: k and v as wide as q
    mlp = 3 * 4096 * 11008
    embeddings = 2 * 32000 * 4096  # untied lm head
    assert model.params_total == 32 * (attention + mlp) + embeddings == 6_738_149_376
    assert model.kv_bytes_per_token == 2 * 32 * 32 * 128 * 2 == 524288
    assert model.weight_bytes == 2 * model.params_total  # float16
    assert model.head_dim == 128 and not model.is_moe


@pytest.mark.parametrize(
    ("name", "billions"),
    [
        ("meta-llama/Llama-3.1-8B-Instruct", 8.03),
        ("meta-llama/Llama-3.1-70B-Instruct", 70.6),
        ("meta-llama/Llama-3.1-405B-Instruct", 405.85),
        ("Qwen/Qwen2.5-72B-Instruct", 72.7),
        ("Qwen/Qwen3-235B-A22B", 235.1),
        ("Qwen/Qwen3-30B-A3B", 30.5),
        ("mistralai/Mistral-Small-24B-Instruct-2501", 23.6),
    ],
)
def test_published_parameter_counts(name: str, billions: float) -> None:
    assert load_model(name).params_total / 1e9 == pytest.approx(billions, abs=0.05)


def test_mixtral_8x7b_total_and_active_parameters() -> None:
    model = load_model("mistralai/Mixtral-8x7B-v0.1")
    assert model.is_moe and model.moe_layers == 32 and model.experts_per_token == 2
    assert model.params_total / 1e9 == pytest.approx(46.7, abs=0.05)
    # The published 12.9B active counts the embedding table, which is a lookup, not a
    # matmul: params_active_per_token leaves it out.
    active = model.params_active_per_token
    assert (active + model.embedding_params) / 1e9 == pytest.approx(12.9, abs=0.05)
    attention = 4096 * 32 * 128 * 2 + 4096 * 8 * 128 * 2
    assert active == 32 * (attention + 2 * 3 * 4096 * 14336) + 32000 * 4096
    assert model.flops_per_token == 2 * active


def test_llama_4_scout_reads_text_config_fields_and_fp8_weights() -> None:
    model = load_model("RedHatAI/Llama-4-Scout-17B-16E-Instruct-FP8-dynamic")
    assert model.weight_bytes_per_param == 1.0  # 8-bit float weights
    assert (model.num_experts, model.experts_per_token, model.moe_layers) == (16, 1, 48)
    assert model.intermediate_size == 8192 == model.shared_expert_intermediate_size
    assert model.dense_intermediate_size == 16384
    active_with_embedding = model.params_active_per_token + model.embedding_params
    assert active_with_embedding / 1e9 == pytest.approx(17.2, abs=0.1)  # "17B" active


def test_qwen3_moe_expert_width_is_moe_intermediate_size() -> None:
    model = load_model("Qwen/Qwen3-30B-A3B")
    assert (model.intermediate_size, model.dense_intermediate_size) == (768, 6144)
    assert (model.num_experts, model.experts_per_token, model.num_kv_heads) == (128, 8, 4)
    assert model.shared_expert_intermediate_size == 0 and model.router_params_per_layer > 0


@pytest.mark.parametrize("name", sorted(REFERENCE))
def test_every_reference_model_reads_as_its_preset(name: str) -> None:
    spec = ModelSpec.from_config(REFERENCE[name], name)
    assert spec == load_model(name)
    config = REFERENCE[name]
    assert spec.num_layers == config["num_hidden_layers"]
    assert spec.num_kv_heads == config["num_key_value_heads"]
    assert spec.head_dim == config.get(
        "head_dim", config["hidden_size"] // config["num_attention_heads"]
    )
    assert spec.kv_bytes_per_token == 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * 2


def test_every_preset_loads_and_families_are_there() -> None:
    for name in MODELS:
        assert load_model(name).params_total > 0
    for name in (
        "meta-llama/Llama-3.2-1B-Instruct",
        "meta-llama/Llama-3.3-70B-Instruct",
        "Qwen/Qwen2.5-0.5B-Instruct",
        "Qwen/Qwen3-0.6B",
        "Qwen/Qwen3-32B",
        "mistralai/Mistral-7B-Instruct-v0.3",
        "mistralai/Mixtral-8x22B-Instruct-v0.1",
    ):
        assert name in MODELS


def test_tied_embeddings_have_no_lm_head() -> None:
    model = load_model("meta-llama/Llama-3.2-1B-Instruct")
    assert model.tie_word_embeddings and model.lm_head_params == 0
    assert model.head_dim == 64


def test_attention_flops_formula() -> None:
    model = load_model("meta-llama/Llama-3.1-8B-Instruct")
    per_pair = 4 * 32 * 32 * 128
    assert model.attention_flops(1, 100) == per_pair * (100 + 1)  # one decode token
    assert model.attention_flops(4, 0) == per_pair * 10  # causal: 1 + 2 + 3 + 4
    assert model.attention_flops(0, 50) == 0


def test_names_match_case_insensitively_and_precision_overrides() -> None:
    assert load_model("META-LLAMA/llama-3.1-8b-instruct").name == "meta-llama/Llama-3.1-8B-Instruct"
    fp8 = load_model("meta-llama/Llama-3.1-8B-Instruct", precision="fp8", kv_cache_dtype="fp8")
    assert fp8.weight_bytes_per_param == 1.0 and fp8.kv_bytes_per_element == 1.0
    assert fp8.kv_bytes_per_token == 65536
    auto = load_model("meta-llama/Llama-3.1-8B-Instruct", kv_cache_dtype="auto")
    assert auto.kv_bytes_per_element == 2.0


def test_local_config_path_and_directory(tmp_path: Path) -> None:
    config = dict(REFERENCE["meta-llama/Llama-3.1-8B-Instruct"])
    (tmp_path / "config.json").write_text(json.dumps(config))
    by_file = load_model(tmp_path / "config.json")
    by_dir = load_model(str(tmp_path))
    assert (
        by_file.params_total
        == by_dir.params_total
        == load_model("meta-llama/Llama-3.1-8B").params_total
    )
    assert by_dir.name == str(tmp_path / "config.json")


def test_a_config_with_fp8_config_groups_is_fp8(tmp_path: Path) -> None:
    config = dict(REFERENCE["meta-llama/Llama-3.1-8B-Instruct"])
    config["quantization_config"] = {
        "quant_method": "compressed-tensors",
        "config_groups": {"group_0": {"weights": {"num_bits": 8, "type": "float"}}},
    }
    assert ModelSpec.from_config(config, "x").weight_bytes_per_param == 1.0
    config["quantization_config"] = {"quant_method": "fp8"}
    assert ModelSpec.from_config(config, "x").weight_bytes_per_param == 1.0


def test_unknown_model_guesses() -> None:
    with pytest.raises(ModelConfigError, match=r"did you mean 'meta-llama/Llama-3.1-8B-Instruct'"):
        load_model("llama-3.1-8b-instruc")
    with pytest.raises(ModelConfigError, match=r"did you mean 'Qwen/Qwen3-8B'"):
        load_model("Qwen3-8B")
    with pytest.raises(ModelConfigError, match="does not exist"):
        load_model("/nowhere/config.json")


def test_a_folder_without_config_json_says_so(tmp_path: Path) -> None:
    with pytest.raises(ModelConfigError, match=r"model folder '.*' has no config.json$"):
        load_model(str(tmp_path))


def test_missing_or_bad_fields_are_one_line_naming_field_and_model(tmp_path: Path) -> None:
    config = dict(REFERENCE["meta-llama/Llama-2-7b-hf"])
    del config["hidden_size"]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    with pytest.raises(ModelConfigError, match=r"config.json: config has no 'hidden_size'") as info:
        load_model(path)
    assert "\n" not in str(info.value)
    config["hidden_size"] = -1
    with pytest.raises(ModelConfigError, match="hidden_size must be a positive integer"):
        ModelSpec.from_config(config, "mine")
    config["hidden_size"] = 4096
    config["quantization_config"] = {"quant_method": "awq", "bits": 4}
    with pytest.raises(ModelConfigError, match="mine: quantization 'awq' is not supported"):
        ModelSpec.from_config(config, "mine")
    path.write_text("{not json")
    with pytest.raises(ModelConfigError, match="not a readable JSON config"):
        load_model(path)


def test_absent_kv_heads_mean_one_per_head_and_mla_is_refused() -> None:
    config = dict(REFERENCE["meta-llama/Llama-3.1-8B-Instruct"])
    config["num_key_value_heads"] = None
    assert ModelSpec.from_config(config, "mha").num_kv_heads == 32
    del config["num_key_value_heads"]
    assert ModelSpec.from_config(config, "mha").num_kv_heads == 32
    config["kv_lora_rank"] = 512
    with pytest.raises(
        ModelConfigError, match=r"deepseek: MLA attention \('kv_lora_rank'\) is not"
    ):
        ModelSpec.from_config(config, "deepseek")


def test_bad_options() -> None:
    with pytest.raises(ValueError, match="unknown precision 'int4'"):
        load_model("Qwen/Qwen3-8B", precision="int4")
    with pytest.raises(ValueError, match="unknown kv_cache_dtype 'fp4'"):
        load_model("Qwen/Qwen3-8B", kv_cache_dtype="fp4")
    with pytest.raises(TypeError, match="a model must be a name or a path"):
        load_model(8)  # type: ignore[arg-type]
