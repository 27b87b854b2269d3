"""GPU-selection variables place a server; they are passed to it, never recorded or compared."""

from __future__ import annotations

from batch_invariance.engines.llama_server.env import engine_env, measured_env, served_env

RUNNER = {
    "CUDA_VISIBLE_DEVICES": "1",
    "NVIDIA_VISIBLE_DEVICES": "all",
    "NVIDIA_DRIVER_CAPABILITIES": "compute,utility",
    "NVIDIA_TF32_OVERRIDE": "0",
    "GGML_CUDA_DISABLE_FUSION": "1",
    "PATH": "/usr/bin",
}


def test_selection_is_passed_to_a_measured_server_but_not_recorded() -> None:
    assert engine_env(RUNNER) == {"GGML_CUDA_DISABLE_FUSION": "1", "NVIDIA_TF32_OVERRIDE": "0"}
    passed = measured_env(RUNNER)
    assert passed["CUDA_VISIBLE_DEVICES"] == "1" and passed["NVIDIA_VISIBLE_DEVICES"] == "all"


def test_serve_places_the_server_where_the_caller_says() -> None:
    recorded = {"GGML_CUDA_DISABLE_FUSION": "1", "NVIDIA_TF32_OVERRIDE": "0"}
    served = served_env({**RUNNER, "CUDA_VISIBLE_DEVICES": "0"}, recorded)
    assert served.refused == ()
    assert served.env["CUDA_VISIBLE_DEVICES"] == "0"


def test_an_older_certs_recorded_selection_is_not_re_applied() -> None:
    older = {"GGML_CUDA_DISABLE_FUSION": "1", "CUDA_VISIBLE_DEVICES": "1"}
    served = served_env({"GGML_CUDA_DISABLE_FUSION": "1", "PATH": "/bin"}, older)
    assert "CUDA_VISIBLE_DEVICES" not in served.env and served.refused == ()
    placed = served_env({"GGML_CUDA_DISABLE_FUSION": "1", "CUDA_VISIBLE_DEVICES": "0"}, older)
    assert placed.refused == () and placed.env["CUDA_VISIBLE_DEVICES"] == "0"
