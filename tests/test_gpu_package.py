"""The names docs/predict.md and docs/gpu.md use from ``simsim.gpu`` import from there."""

import simsim
import simsim.gpu
from simsim.gpu import physics, vllm


def test_the_vllm_server_and_its_cost_model_import_from_simsim_gpu() -> None:
    from simsim.gpu import PhysicsBackend, VllmConfig, client_latencies

    assert VllmConfig is vllm.VllmConfig is simsim.VllmConfig
    assert PhysicsBackend is physics.PhysicsBackend
    assert client_latencies is physics.client_latencies
    assert simsim.gpu.vllm_server is vllm.vllm_server
    assert simsim.gpu.DEFAULT_COEFFICIENTS is physics.DEFAULT_COEFFICIENTS
    assert simsim.gpu.FrontendOverheads is physics.FrontendOverheads
    assert simsim.gpu.PhysicsCoefficients is physics.PhysicsCoefficients
    assert simsim.gpu.client_token_gaps_us is physics.client_token_gaps_us


def test_predict_md_first_example_runs() -> None:
    from simsim.gpu import VllmConfig

    server = VllmConfig("meta-llama/Llama-3.1-8B-Instruct", "H100", tp=1)
    assert server.memory().kv_tokens == 452_736
    assert isinstance(server.engine(), simsim.BatchingEngine)
