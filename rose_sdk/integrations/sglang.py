"""SGLang as a :class:`rose_sdk.integrations.rollout.RolloutEngine` (written, type-checked, not yet
run on a GPU: its tests are in the device tier, ``tests/device/rose_sdk/test_rollout_engines.py``).

    import sglang
    engine = SGLangEngine(sglang.Engine(model_path=path, enable_memory_saver=True,
                                        mem_fraction_static=0.5), mem_fraction_static=0.5)
    wl = init_rollout(engine, level=2, weights=lambda: policy.state_dict())

* ``sleep(level)`` is ``release_memory_occupation()`` (weights and KV cache). SGLang keeps a host
  copy of the weights only when started with ``enable_weights_cpu_backup=True``: that is level 1
  (pass ``weights_backed_up=True``); otherwise the weights are dropped, level 2, and a level-1
  sleep is refused rather than silently losing them.
* ``wake()`` is ``resume_memory_occupation()``; after level 2 ``generate`` refuses to run until
  ``load_weights`` wrote the weights (``update_weights_from_tensor(pairs)``, SGLang's co-located
  refit; ``flush_cache`` drops the prefix cache made with the old weights).
* ``generate(prompts, seeds)``: one sampling-params dict per prompt with ``sampling_seed``
  (honoured by SGLang's deterministic sampling, ``enable_deterministic_inference=True``).

The engine must be idle when it is released (SGLang asserts no request runs): call the SDK's
``safe_point`` between ``generate`` calls, never from another thread during one. Register with the
``cooperative`` backend (SGLang's GPU memory is in its scheduler process). SGLang is never imported:
the engine object is built by the caller.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import torch

from rose_sdk.integrations.rollout import (
    DROPS_WEIGHTS,
    KEEPS_WEIGHTS,
    EngineSleepState,
    Sample,
    Weights,
    check_level,
    check_seeds,
    weight_items,
)


class SGLangLike(Protocol):
    """The part of ``sglang.Engine`` this adapter calls."""

    def release_memory_occupation(self, tags: list[str] | None = None) -> Any: ...

    def resume_memory_occupation(self, tags: list[str] | None = None) -> Any: ...

    def update_weights_from_tensor(
        self, named_tensors: list[tuple[str, torch.Tensor]], load_format: str | None = None, flush_cache: bool = True
    ) -> Any: ...

    def generate(self, prompt: Any = None, sampling_params: Any = None, *args: Any, **kwargs: Any) -> Any: ...


class SGLangEngine(EngineSleepState):
    """``engine``: an ``sglang.Engine`` built with ``enable_memory_saver=True``;
    ``mem_fraction_static``: the fraction of the device it was given (what a sleep frees)."""

    def __init__(
        self,
        engine: SGLangLike,
        *,
        mem_fraction_static: float = 0.88,
        device_bytes: int | None = None,
        weights_backed_up: bool = False,
    ) -> None:
        super().__init__(device_bytes, mem_fraction_static)
        self.engine = engine
        self.weights_backed_up = weights_backed_up

    def sleep(self, level: int = KEEPS_WEIGHTS) -> None:
        check_level(level)
        if level == KEEPS_WEIGHTS and not self.weights_backed_up:
            raise ValueError(
                "SGLang keeps no host copy of the weights unless started with "
                "enable_weights_cpu_backup=True (then pass weights_backed_up=True); "
                "or sleep at level 2 and reload them"
            )
        if self.sleeping:
            return
        self.engine.release_memory_occupation()
        self._level = level

    def wake(self) -> None:
        if not self.sleeping:
            return
        self.engine.resume_memory_occupation()
        self._needs_weights = self._level == DROPS_WEIGHTS
        self._level = 0

    def load_weights(self, weights: Weights) -> None:
        self._require_awake()
        self.engine.update_weights_from_tensor([(n, t) for n, t in weight_items(weights)], flush_cache=True)
        self._needs_weights = False

    def generate(
        self, prompts: Sequence[str], seeds: Sequence[int], *, max_new_tokens: int = 16, temperature: float = 1.0
    ) -> list[Sample]:
        check_seeds(prompts, seeds)
        self._require_ready()
        params = [
            {"temperature": temperature, "max_new_tokens": max_new_tokens, "sampling_seed": int(s)} for s in seeds
        ]
        outs = self.engine.generate(prompt=list(prompts), sampling_params=params)
        return [
            Sample(p, int(s), tuple(int(t) for t in o.get("output_ids", ())), str(o["text"]))
            for p, s, o in zip(prompts, seeds, outs, strict=True)
        ]
