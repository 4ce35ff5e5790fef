"""Rollout engines behind one small protocol, suspended and resumed through the node agent.

An RL job's rollout side (the policy generating samples) runs in an inference engine: Hugging Face
``generate`` (:mod:`rose_sdk.integrations.transformers_generate`), vLLM
(:mod:`rose_sdk.integrations.vllm`) or SGLang (:mod:`rose_sdk.integrations.sglang`). All three can
give their GPU memory back and take it again, and :class:`RolloutEngine` names that once:

* ``sleep(level)``: free the engine's device memory. Level 1 keeps the weights in host memory
  (the KV cache is dropped); level 2 drops the weights too (nothing held in host memory: the
  trainer has the policy, ``load_weights`` puts it back after ``wake``). The levels are vLLM's.
* ``wake()``: take the device memory again (level 1: the weights come back from host memory).
* ``load_weights(weights)``: a ``state_dict`` or an iterator of ``(name, tensor)`` (the weight
  sync of an RL step, and the reload after a level-2 sleep).
* ``generate(prompts, seeds)``: one sample per prompt, each drawn with its own seed.

:class:`EngineOffloader` plugs an engine into :class:`rose_sdk.Workload`'s suspend / resume: the
node agent's SUSPEND, at the rollout loop's next ``safe_point``, runs ``engine.sleep(level)``
(then offloads any trainer tensors given too) and acknowledges; RESUME runs ``engine.wake()``,
reloads the weights if the level dropped them (``weights=``, a callable returning them: the
trainer's ``state_dict``, a weight-sync source) and acknowledges. A sleep or wake that raises is a
refused suspend / a failed resume, as for any workload (a failed resume can be retried).

    engine = TransformersGenerateEngine(model, tokenizer)
    wl = init_rollout(engine, level=1)          # rose_sdk.init with the engine's offloader
    for step in range(n):
        samples = engine.generate(prompts, seeds=[base + i for i in range(len(prompts))])
        wl.safe_point(step)                     # suspend (sleep) / resume (wake) happen here

Imports torch and the SDK only; never an engine's package (each adapter imports its own lazily).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

import torch

from rose_sdk.offload import CooperativeOffloader, OffloadReport

if TYPE_CHECKING:
    from rose_sdk.workload import Workload

Weights: TypeAlias = Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]
"""A ``state_dict`` or an iterator of ``(name, tensor)``, as ``load_weights`` takes them."""

KEEPS_WEIGHTS = 1  # sleep level 1: weights parked in host memory, KV cache dropped
DROPS_WEIGHTS = 2  # sleep level 2: weights dropped as well; load_weights after wake


@dataclass(frozen=True)
class Sample:
    """One generated sample: the prompt, the seed it was drawn with, the new tokens and their text."""

    prompt: str
    seed: int
    token_ids: tuple[int, ...]
    text: str


class RolloutEngine(Protocol):
    """What the SDK needs of a rollout engine (structural: any object with these methods)."""

    @property
    def sleeping(self) -> bool: ...

    def sleep(self, level: int = KEEPS_WEIGHTS) -> None: ...

    def wake(self) -> None: ...

    def load_weights(self, weights: Weights) -> None: ...

    def generate(
        self, prompts: Sequence[str], seeds: Sequence[int], *, max_new_tokens: int = 16, temperature: float = 1.0
    ) -> list[Sample]: ...

    def device_bytes(self) -> int:
        """Device memory a sleep gives back, as far as the engine knows (weights and caches)."""
        ...


def check_level(level: int) -> int:
    if level not in (KEEPS_WEIGHTS, DROPS_WEIGHTS):
        raise ValueError(
            f"sleep level must be {KEEPS_WEIGHTS} (keep weights in host memory) or {DROPS_WEIGHTS} "
            f"(drop them; reload after wake), got {level}"
        )
    return level


def check_seeds(prompts: Sequence[str], seeds: Sequence[int]) -> None:
    if len(prompts) != len(seeds):
        raise ValueError(f"one seed per prompt: {len(prompts)} prompts, {len(seeds)} seeds")


def weight_items(weights: Weights) -> Iterable[tuple[str, torch.Tensor]]:
    """``(name, tensor)`` pairs of a ``state_dict`` or of an iterator of pairs."""
    if isinstance(weights, Mapping):
        return weights.items()
    return weights


class EngineSleepState:
    """What an adapter over an engine that sleeps itself (vLLM, SGLang) tracks: the level it sleeps
    at, whether a level-2 wake still owes the weights, and the device bytes a sleep frees (given, or
    ``fraction`` of the current CUDA device, what the engine was started with)."""

    def __init__(self, device_bytes: int | None, fraction: float) -> None:
        if device_bytes is None:
            total = torch.cuda.get_device_properties(torch.cuda.current_device()).total_memory
            device_bytes = int(total * fraction)
        self._device_bytes = device_bytes
        self._level = 0  # 0 awake, else the level it sleeps at
        self._needs_weights = False

    @property
    def sleeping(self) -> bool:
        return self._level != 0

    @property
    def needs_weights(self) -> bool:
        return self._needs_weights

    def device_bytes(self) -> int:
        return self._device_bytes

    def _require_awake(self) -> None:
        if self.sleeping:
            raise RuntimeError("the engine sleeps: wake() before load_weights")

    def _require_ready(self) -> None:
        if self.sleeping or self._needs_weights:
            raise RuntimeError("the engine sleeps or waits for its weights (load_weights after a level-2 wake)")


@dataclass
class EngineStats:
    """What the offloader did: counts and the last sleep / wake / reload durations (seconds)."""

    sleeps: int = 0
    wakes: int = 0
    reloads: int = 0
    last_sleep_s: float = 0.0
    last_wake_s: float = 0.0
    last_reload_s: float = 0.0


class EngineOffloader(CooperativeOffloader):
    """A :class:`CooperativeOffloader` whose offload is ``engine.sleep(level)`` and whose restore is
    ``engine.wake()`` (plus ``load_weights(weights())`` when the level dropped the weights).

    ``model`` / ``optimizer`` / ``tensors``: a trainer colocated in the same process, offloaded
    after the engine sleeps and restored before it wakes (the weights callable may read them).
    ``weights``: required for level 2; called at every resume.
    """

    def __init__(
        self,
        engine: RolloutEngine,
        *,
        level: int = KEEPS_WEIGHTS,
        weights: Callable[[], Weights] | None = None,
        model: torch.nn.Module | None = None,
        optimizer: torch.optim.Optimizer | None = None,
        tensors: Mapping[str, torch.Tensor] | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        super().__init__(model, optimizer, tensors, device=device)
        self.engine = engine
        self.level = check_level(level)
        if level == DROPS_WEIGHTS and weights is None:
            raise ValueError(
                "sleep level 2 drops the engine's weights: pass weights= (a callable returning the "
                "state_dict or (name, tensor) pairs to reload after wake), or use level 1"
            )
        self.weights = weights
        self.stats = EngineStats()
        self._engine_bytes = 0  # what the engine held when it slept (reported while suspended)
        self._asleep = False  # slept by offload() and not yet woken (and reloaded) by restore()

    def state_bytes(self) -> int:
        own = super().state_bytes()
        return own + (self._engine_bytes if self._asleep else self.engine.device_bytes())

    def offload(self) -> OffloadReport:
        if self._asleep:
            return OffloadReport(0, 0, 0.0, True)
        t0 = time.perf_counter()
        nbytes = self.engine.device_bytes()
        self.engine.sleep(self.level)
        self.stats.sleeps += 1
        self.stats.last_sleep_s = time.perf_counter() - t0
        try:
            own = super().offload()
        except Exception:
            self._wake()  # nothing half-done: the engine runs again, the suspend is refused
            raise
        self._asleep, self._engine_bytes = True, nbytes
        # a level-2 sleep moves nothing to host memory: its bytes are dropped, not moved
        moved = own.bytes_moved + (nbytes if self.level == KEEPS_WEIGHTS else 0)
        return OffloadReport(moved, own.tensors, time.perf_counter() - t0, own.arena_reused, own.copy_seconds)

    def restore(self) -> OffloadReport:
        """Restore the trainer's tensors, wake the engine, reload its weights after level 2. Each
        part that already succeeded is skipped when a failed restore is retried."""
        if not self._asleep:
            return OffloadReport(0, 0, 0.0, True)
        t0 = time.perf_counter()
        own = super().restore()  # a no-op on a retry after it succeeded
        self._wake()  # engine.wake() is a no-op once awake; the reload runs until it succeeds
        self._asleep = False
        moved = own.bytes_moved + (self._engine_bytes if self.level == KEEPS_WEIGHTS else 0)
        self._engine_bytes = 0
        return OffloadReport(moved, own.tensors, time.perf_counter() - t0, own.arena_reused, own.copy_seconds)

    def _wake(self) -> None:
        t0 = time.perf_counter()
        self.engine.wake()
        self.stats.wakes += 1
        self.stats.last_wake_s = time.perf_counter() - t0
        if self.level == DROPS_WEIGHTS:
            assert self.weights is not None
            t1 = time.perf_counter()
            self.engine.load_weights(self.weights())
            self.stats.reloads += 1
            self.stats.last_reload_s = time.perf_counter() - t1


def attach(
    engine: RolloutEngine,
    *,
    level: int = KEEPS_WEIGHTS,
    weights: Callable[[], Weights] | None = None,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    tensors: Mapping[str, torch.Tensor] | None = None,
    **workload_kwargs: Any,
) -> Workload:
    """A :class:`rose_sdk.Workload` (not started) whose suspend sleeps ``engine`` and whose resume
    wakes it; the other keyword arguments go to ``Workload`` (socket_path, pod_uid, checkpoint_path…)."""
    from rose_sdk.workload import Workload

    off = EngineOffloader(engine, level=level, weights=weights, model=model, optimizer=optimizer, tensors=tensors)
    return Workload(model=model, optimizer=optimizer, offloader=off, **workload_kwargs)


def init_rollout(
    engine: RolloutEngine,
    *,
    level: int = KEEPS_WEIGHTS,
    weights: Callable[[], Weights] | None = None,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    tensors: Mapping[str, torch.Tensor] | None = None,
    **workload_kwargs: Any,
) -> Workload:
    """``rose_sdk.init`` for a rollout process: the process's workload, registered with the node agent
    named by the environment (``ROSE_AGENT_SOCKET`` …), its suspend / resume driving ``engine``."""
    from rose_sdk.workload import init

    off = EngineOffloader(engine, level=level, weights=weights, model=model, optimizer=optimizer, tensors=tensors)
    return init(model=model, optimizer=optimizer, offloader=off, **workload_kwargs)


def offloader_of(workload: Workload) -> EngineOffloader:
    """The :class:`EngineOffloader` of a workload made by :func:`attach` / :func:`init_rollout`."""
    off = workload.offloader
    if not isinstance(off, EngineOffloader):
        raise TypeError("this workload was not made by rose_sdk.integrations.rollout.attach / init_rollout")
    return off
