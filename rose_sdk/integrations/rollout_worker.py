"""Elastic rollout workers: the worker loop over a :class:`~rose_sdk.integrations.rollout.RolloutEngine`,
and the trainer's side for TRL's ``GRPOTrainer`` (its ``rollout_func``).

The trainer runs :class:`rose_sdk.rollout_service.RolloutService`; :func:`grpo_rollout_func` makes
TRL's real ``GRPOTrainer`` take its completions from it instead of generating in-process: at each
generation it publishes the current policy weights (version = the trainer's global step), submits
the batch's prompts as one round (prompt id ``g<version>-<index in the batch>``, each with its seed
``prompt_seed(job seed, id, version)``), and waits for every completion.

A rollout worker (:class:`RolloutWorker`) pulls the weights before its first sample and whenever a
lease names a newer version, leases prompts, generates each with the prompt's own seed, returns the
completions, and calls its workload's ``safe_point`` between leases. On a suspend or a world
change (the workload's callbacks) it releases its leases, so a worker that is reclaimed holds no
prompt: none lost, and the queue accepts one completion per ``(prompt id, version)``: none
counted twice.

Batch invariance: with :class:`~rose_sdk.integrations.transformers_generate.TransformersGenerateEngine`
at ``batch_invariant=True`` a prompt's tokens depend only on (weights, prompt, seed) — not on
which worker drew it, with which other prompts, or how many workers there were — so a run with a
changing rollout world trains to the same weights, bit for bit, as one with a constant world
(``tests/contract/rose_sdk/test_rollout_elastic.py``).
"""

from __future__ import annotations

import io
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from rose_sdk.integrations.rollout import RolloutEngine, Sample
from rose_sdk.rollout_service import RolloutClient, RolloutError, RolloutService

if TYPE_CHECKING:
    from rose_sdk.workload import Workload
    from rose_sdk.world import World

log = logging.getLogger("rose_sdk.rollout")


def weights_blob(state: Mapping[str, torch.Tensor]) -> bytes:
    """A ``state_dict`` as the bytes the service serves (``torch.save`` of CPU copies)."""
    buf = io.BytesIO()
    torch.save({k: v.detach().to("cpu", copy=True) for k, v in state.items()}, buf)
    return buf.getvalue()


def weights_from_blob(blob: bytes) -> dict[str, torch.Tensor]:
    """The ``state_dict`` of :func:`weights_blob` (``weights_only``: no code is unpickled)."""
    obj = torch.load(io.BytesIO(blob), map_location="cpu", weights_only=True)
    if not isinstance(obj, dict) or not all(isinstance(v, torch.Tensor) for v in obj.values()):
        raise RolloutError("the weights blob is not a state_dict of tensors")
    return obj


@dataclass
class WorkerStats:
    """What a worker did: samples, leases, weight pulls, the seconds from its start to its first
    weights and first sample, releases."""

    samples: int = 0
    leases: int = 0
    refused: int = 0  # completions the service refused (duplicate or stale)
    weight_pulls: int = 0
    weight_bytes: int = 0
    released: int = 0
    started: float = field(default_factory=time.monotonic)
    first_weights_s: float | None = None
    first_sample_s: float | None = None
    loop_cpu_s: float = 0.0  # the process's CPU seconds spent in run() (all its threads)


class RolloutWorker:
    """One rollout worker: ``client`` to the trainer's service, ``engine`` generating.

    ``batch``: prompts per lease (each generated with its own seed; with a batch-invariant engine
    the size changes the speed, never the tokens). ``eos_token_id``: appended to a completion that
    stopped before ``max_new_tokens`` (the engine strips it; the trainer must see it to learn to
    stop). ``workload``: the process's ROSE workload (``init_rollout``): its ``safe_point`` runs
    between leases, and its suspend and world-change callbacks release this worker's leases.
    """

    def __init__(
        self,
        client: RolloutClient,
        engine: RolloutEngine,
        *,
        batch: int = 1,
        max_new_tokens: int = 16,
        temperature: float = 1.0,
        eos_token_id: int | None = None,
        workload: Workload | None = None,
        wait_s: float = 2.0,
    ) -> None:
        if batch < 1:
            raise ValueError(f"batch must be >= 1, got {batch}")
        self.client = client
        self.engine = engine
        self.batch = batch
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.eos_token_id = eos_token_id
        self.wait_s = wait_s
        self.version: int | None = None
        self.stats = WorkerStats()
        self.workload = workload
        self._step = 0
        if workload is not None:
            workload.on_suspend(self._release_for("suspend"))
            workload.on_world_change(self._on_world)

    def _release_for(self, why: str) -> Callable[[], None]:
        def release() -> None:
            n = self.client.release()
            self.stats.released += n
            log.info("worker %s: %s, %d leases released", self.client.worker, why, n)

        return release

    def _on_world(self, world: World) -> None:
        self._release_for(f"world {world.active}/{world.total}")()

    def pull(self) -> int:
        """Pull the current weights into the engine; their version."""
        version, blob = self.client.weights()
        self.engine.load_weights(weights_from_blob(blob))
        self.version = version
        self.stats.weight_pulls += 1
        self.stats.weight_bytes += len(blob)
        if self.stats.first_weights_s is None:
            self.stats.first_weights_s = time.monotonic() - self.stats.started
        log.info("worker %s: policy version %d pulled (%d bytes)", self.client.worker, version, len(blob))
        return version

    def step(self) -> bool:
        """One lease → generate → complete, then the safe point. False once the trainer is done."""
        reply = self.client.lease(self.batch, self.wait_s)
        if reply.prompts:
            assert reply.version is not None
            self.stats.leases += 1
            if reply.version != self.version and self.pull() != reply.version:
                # the trainer moved on between the lease and the pull: these prompts are not for it
                self.stats.released += self.client.release()
            else:
                samples = self.engine.generate(
                    [p.text for p in reply.prompts],
                    [p.seed for p in reply.prompts],
                    max_new_tokens=self.max_new_tokens,
                    temperature=self.temperature,
                )
                got = self.client.complete(
                    reply.version, [self._result(p.id, s) for p, s in zip(reply.prompts, samples, strict=True)]
                )
                self.stats.samples += got["accepted"]
                self.stats.refused += got["duplicate"] + got["stale"]
                if self.stats.first_sample_s is None:
                    self.stats.first_sample_s = time.monotonic() - self.stats.started
        self._step += 1
        if self.workload is not None:
            self.workload.add_progress(samples=len(reply.prompts))
            self.workload.safe_point(self._step)
        return not reply.done

    def _result(self, pid: str, s: Sample) -> tuple[str, tuple[int, ...], str]:
        ids = s.token_ids
        if self.eos_token_id is not None and len(ids) < self.max_new_tokens:
            ids = (*ids, self.eos_token_id)
        return pid, ids, s.text

    def run(self, stop: threading.Event | None = None, *, pull_first: bool = True) -> WorkerStats:
        """Lease and generate until the trainer is done or ``stop`` is set; the leases are released
        at the end. ``pull_first``: pull the weights before the first lease when there are any."""
        cpu0 = time.process_time()
        try:
            if pull_first and self.client.version() is not None:
                self.pull()
            while stop is None or not stop.is_set():
                if not self.step():
                    break
        finally:
            try:
                self.stats.released += self.client.release()
            except RolloutError as e:
                log.warning(
                    "worker %s: leases not released at exit (%s); they return when they expire", self.client.worker, e
                )
            self.stats.loop_cpu_s = time.process_time() - cpu0
        return self.stats


def grpo_rollout_func(
    service: RolloutService, *, timeout_s: float | None = None
) -> Callable[[list[Any], Any], dict[str, Any]]:
    """A ``rollout_func`` for TRL's ``GRPOTrainer(..., rollout_func=...)``: each generation
    publishes the trainer's weights (version = ``trainer.state.global_step``), submits the batch's
    prompts (TRL's list, each prompt once per completion it wants) and returns the workers'
    completions in order. Text prompts only (no chat templates)."""

    def rollout(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        if not all(isinstance(p, str) for p in prompts):
            raise TypeError("grpo_rollout_func takes text prompts only (no conversational prompts)")
        version = int(trainer.state.global_step)
        if service.weights_version != version:
            service.publish_weights(version, weights_blob(trainer.accelerator.unwrap_model(trainer.model).state_dict()))
        v = service.submit_round([(f"g{version}-{i}", p) for i, p in enumerate(prompts)])
        done = service.wait_round(v, timeout_s)
        completion_ids = [list(done[f"g{version}-{i}"].token_ids) for i in range(len(prompts))]
        prompt_ids = trainer.processing_class(prompts)["input_ids"]
        return {"prompt_ids": prompt_ids, "completion_ids": completion_ids, "logprobs": None}

    return rollout
