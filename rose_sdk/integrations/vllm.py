"""vLLM as a :class:`rose_sdk.integrations.rollout.RolloutEngine` (written, type-checked, not yet run
on a GPU: its tests are in the device tier, ``tests/device/rose_sdk/test_rollout_engines.py``).

    from vllm import LLM
    llm = LLM(model=path, enable_sleep_mode=True, gpu_memory_utilization=0.5)
    engine = VLLMEngine(llm, gpu_memory_utilization=0.5)
    wl = init_rollout(engine, level=2, weights=lambda: policy.state_dict())

* ``sleep(level)`` is ``llm.sleep(level=level)``: level 1 backs the weights up in host memory and
  drops the KV cache; level 2 drops both (vLLM keeps the model's buffers, e.g. rope tables).
* ``wake()`` after level 1 is ``llm.wake_up()``. After level 2 it wakes only the weights
  (``wake_up(tags=["weights"])``): ``load_weights`` writes them, then wakes the KV cache, so the
  peak during a reload is the weights alone (vLLM's RLHF sequence). ``generate`` refuses to run
  until the weights were reloaded.
* ``load_weights(weights)`` runs ``model.load_weights(pairs)`` on vLLM's model in each worker
  (``llm.apply_model``; vLLM's V1 engine runs its workers in another process unless
  ``VLLM_ENABLE_V1_MULTIPROCESSING=0``, and then pickles the function and the tensors:
  ``VLLM_ALLOW_INSECURE_SERIALIZATION=1``). ``reload_from_disk=True`` instead re-reads the
  checkpoint vLLM was started from (``collective_rpc("reload_weights")``).
* ``generate(prompts, seeds)``: one ``SamplingParams(seed=…)`` per prompt. vLLM's per-request
  seed makes a prompt's draws its own; bit-identical tokens whatever the batch also need vLLM's
  batch-invariant kernels (``VLLM_BATCH_INVARIANT=1``), which this adapter does not set.

Register with the ``cooperative`` backend: vLLM's GPU memory lives in its engine-core process,
not the one that registered, so cuda-checkpoint of the registered PID would move nothing of it.
vLLM is imported when ``generate`` runs, never at import.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from rose_sdk.integrations.rollout import (
    DROPS_WEIGHTS,
    EngineSleepState,
    Sample,
    Weights,
    check_level,
    check_seeds,
    weight_items,
)


class VLLMCompletion(Protocol):
    token_ids: Sequence[int]
    text: str


class VLLMRequestOutput(Protocol):
    @property
    def outputs(self) -> Sequence[VLLMCompletion]: ...


class VLLMLike(Protocol):
    """The part of ``vllm.LLM`` this adapter calls."""

    def sleep(self, level: int = 1) -> None: ...

    def wake_up(self, tags: list[str] | None = None) -> None: ...

    def generate(self, prompts: Any, sampling_params: Any = None, *args: Any, **kwargs: Any) -> Sequence[Any]: ...

    def apply_model(self, func: Callable[[Any], Any]) -> list[Any]: ...

    def collective_rpc(self, method: str, *args: Any, **kwargs: Any) -> list[Any]: ...


def _load_into(pairs: list[tuple[str, torch.Tensor]]) -> Callable[[Any], Any]:
    def load(model: Any) -> Any:  # a vLLM model (torch.nn.Module with load_weights)
        return model.load_weights(iter(pairs))  # vLLM models take an iterable of (name, tensor)

    return load


class VLLMEngine(EngineSleepState):
    """``llm``: a ``vllm.LLM`` built with ``enable_sleep_mode=True``. ``gpu_memory_utilization``:
    the fraction of the device it was given (what a sleep frees, reported to the node agent)."""

    def __init__(
        self,
        llm: VLLMLike,
        *,
        gpu_memory_utilization: float = 0.9,
        device_bytes: int | None = None,
        reload_from_disk: bool = False,
    ) -> None:
        super().__init__(device_bytes, gpu_memory_utilization)
        self.llm = llm
        self.reload_from_disk = reload_from_disk

    def sleep(self, level: int = 1) -> None:
        check_level(level)
        if self.sleeping:
            return
        self.llm.sleep(level=level)
        self._level = level

    def wake(self) -> None:
        if not self.sleeping:
            return
        if self._level == DROPS_WEIGHTS:
            self.llm.wake_up(tags=["weights"])
            self._needs_weights = True
        else:
            self.llm.wake_up()
        self._level = 0

    def load_weights(self, weights: Weights) -> None:
        self._require_awake()
        if self.reload_from_disk:
            self.llm.collective_rpc("reload_weights")
        else:
            self.llm.apply_model(_load_into([(n, t) for n, t in weight_items(weights)]))
        if self._needs_weights:
            self.llm.wake_up(tags=["kv_cache"])
            self._needs_weights = False

    def generate(
        self, prompts: Sequence[str], seeds: Sequence[int], *, max_new_tokens: int = 16, temperature: float = 1.0
    ) -> list[Sample]:
        check_seeds(prompts, seeds)
        self._require_ready()
        from vllm import SamplingParams

        params = [SamplingParams(seed=int(s), temperature=temperature, max_tokens=max_new_tokens) for s in seeds]
        outs: Sequence[VLLMRequestOutput] = self.llm.generate(list(prompts), params, use_tqdm=False)
        return [
            Sample(p, int(s), tuple(int(t) for t in o.outputs[0].token_ids), o.outputs[0].text)
            for p, s, o in zip(prompts, seeds, outs, strict=True)
        ]
