"""Rollout engines on a real GPU: the Transformers ``generate`` engine, vLLM and SGLang, each slept and
woken (level 1: weights parked in host memory; level 2: dropped and reloaded), the device memory
given back while asleep, and the same samples (per-prompt seeds) before and after.

The model is the tiny random Qwen2 of ``tests/support/rollout_tiny.py`` (hidden 256, head size 64: the
attention kernels' smallest common size), saved to a temporary folder in the Hugging Face layout:
nothing is downloaded. vLLM and SGLang are CUDA-only and not dependencies of this repository: their
tests skip, saying so, where the package is not installed; the Transformers one needs only
``transformers``. Written and type-checked; not yet run on a GPU (none lent to this work so far).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.support import rollout_tiny

SEEDS = list(range(len(rollout_tiny.PROMPTS)))
HIDDEN = 256


def _need(module: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as e:
        pytest.skip(f"{module} is not installed here ({e}); install it to run this rollout-engine check")


def _free() -> int:
    import torch

    torch.cuda.synchronize()
    return int(torch.cuda.mem_get_info()[0])


def _tiny_folder(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    _need("transformers")
    folder = tmp_path / "tiny-qwen2"
    m = rollout_tiny.model(0, hidden=HIDDEN)
    m.save_pretrained(folder)
    rollout_tiny.tokenizer().save_pretrained(folder)
    return folder, {k: v.detach().clone() for k, v in m.state_dict().items()}


def test_transformers_engine_frees_the_gpu_while_asleep(cuda: str) -> None:
    _need("transformers")
    import torch

    from rose_sdk import tensors_equal
    from rose_sdk.integrations.transformers_generate import TransformersGenerateEngine

    e = TransformersGenerateEngine(rollout_tiny.model(0, hidden=HIDDEN).to(cuda), rollout_tiny.tokenizer())
    ref = {k: v.detach().clone() for k, v in e.model.state_dict().items()}
    before = e.generate(rollout_tiny.PROMPTS, SEEDS)
    nbytes, held = e.device_bytes(), torch.cuda.memory_allocated()
    for level in (1, 2):
        e.sleep(level)
        assert held - torch.cuda.memory_allocated() >= nbytes  # every weight and buffer left the device
        e.wake()
        if level == 2:
            with pytest.raises(RuntimeError, match="not reloaded"):
                e.generate(rollout_tiny.PROMPTS, SEEDS)
            e.load_weights(ref)
        assert tensors_equal(e.model.state_dict(), ref)
        assert e.generate(rollout_tiny.PROMPTS, SEEDS) == before


def test_vllm_engine_sleeps_wakes_and_reloads(cuda: str, tmp_path: Path) -> None:
    vllm = _need("vllm")
    from rose_sdk.integrations.vllm import VLLMEngine

    folder, weights = _tiny_folder(tmp_path)
    llm = vllm.LLM(
        model=str(folder),
        enable_sleep_mode=True,
        gpu_memory_utilization=0.2,
        enforce_eager=True,
        dtype="float32",
        seed=0,
        max_model_len=128,
    )
    e = VLLMEngine(llm, gpu_memory_utilization=0.2)
    before = e.generate(rollout_tiny.PROMPTS, SEEDS)
    assert len({s.token_ids for s in before}) > 1
    awake = _free()
    e.sleep(1)
    assert _free() > awake + e.device_bytes() // 2  # vLLM's weights and KV cache given back
    e.wake()
    assert e.generate(rollout_tiny.PROMPTS, SEEDS) == before
    e.sleep(2)
    e.wake()
    assert e.needs_weights
    with pytest.raises(RuntimeError, match="load_weights"):
        e.generate(rollout_tiny.PROMPTS, SEEDS)
    e.load_weights(weights)
    assert e.generate(rollout_tiny.PROMPTS, SEEDS) == before


def test_sglang_engine_releases_resumes_and_reloads(cuda: str, tmp_path: Path) -> None:
    sglang = _need("sglang")
    from rose_sdk.integrations.sglang import SGLangEngine

    folder, weights = _tiny_folder(tmp_path)
    engine = sglang.Engine(
        model_path=str(folder),
        enable_memory_saver=True,
        mem_fraction_static=0.2,
        random_seed=0,
        dtype="float32",
        enable_deterministic_inference=True,
    )
    try:
        e = SGLangEngine(engine, mem_fraction_static=0.2)
        with pytest.raises(ValueError, match="enable_weights_cpu_backup"):
            e.sleep(1)
        before = e.generate(rollout_tiny.PROMPTS, SEEDS)
        awake = _free()
        e.sleep(2)
        assert _free() > awake + e.device_bytes() // 2
        e.wake()
        with pytest.raises(RuntimeError, match="load_weights"):
            e.generate(rollout_tiny.PROMPTS, SEEDS)
        e.load_weights({k: v.to(cuda) for k, v in weights.items()})
        assert e.generate(rollout_tiny.PROMPTS, SEEDS) == before
    finally:
        engine.shutdown()
