"""A Ray actor on a lent GPU (verl / OpenRLHF style), registered with its pod's node agent.

On Kubernetes (KubeRay) a Ray worker pod that holds a lent GPU claim has the node agent's socket
mounted by the claim's CDI spec and ``ROSE_AGENT_SOCKET``, ``ROSE_POD_UID``… in its container's
environment; the raylet and the worker processes it starts for actors inherit them. Inside the
actor, :func:`register_actor` registers that process (the one holding the GPU) with the agent:

    @ray.remote(num_gpus=1)
    class Rollout:
        def __init__(self):
            self.engine = TransformersGenerateEngine(model, tokenizer)  # or VLLMEngine, SGLangEngine
            self.rose = register_actor(engine=self.engine)              # or model=/optimizer= for a trainer

        @rose_method
        def generate(self, prompts, seeds):
            return self.engine.generate(prompts, seeds)

Actor methods run one at a time, so commands cannot wait for a training loop's safe point: the
actor's safe points are the edges of its method calls. :func:`rose_method` (or ``with
self.rose.call():``) runs pending commands before the method and holds the actor's lock while it
runs; between calls a background thread runs them every ``idle_poll_s``. A suspend parks that
thread (or the call) holding the lock, so calls made while suspended wait and run after the
resume: the Ray driver sees a slower call, never a half-moved state.

One registered actor per pod: the agent keys workloads by pod UID, so give each GPU actor its own
worker pod (a worker group of one-GPU pods). Outside Kubernetes (a local Ray, tests)
:func:`actor_env` passes this process's ``ROSE_*`` variables to the actor through ``runtime_env``.
Imports no Ray: the helper works in any long-lived process whose work arrives as calls.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, Protocol, TypeVar

import torch

from rose_sdk.integrations.rollout import KEEPS_WEIGHTS, RolloutEngine, Weights, attach

if TYPE_CHECKING:
    from rose_sdk.workload import Workload

log = logging.getLogger("rose.sdk.ray")
P = ParamSpec("P")
R = TypeVar("R")


class ActorWorkload:
    """A started :class:`rose_sdk.Workload` whose safe points are the actor's call edges and idle time."""

    def __init__(self, workload: Workload, *, idle_poll_s: float = 0.05) -> None:
        self.workload = workload
        self.lock = threading.RLock()
        self.idle_poll_s = idle_poll_s
        self._stop = threading.Event()
        self._idle: threading.Thread | None = None
        if workload.connected_to_agent:
            self._idle = threading.Thread(target=self._idle_loop, name="rose-actor-idle", daemon=True)
            self._idle.start()

    @property
    def suspended(self) -> bool:
        return self.workload.suspended

    def _idle_loop(self) -> None:
        while not self._stop.wait(self.idle_poll_s):
            if self.lock.acquire(blocking=False):  # a call is running: its own edges run the commands
                try:
                    self.workload.safe_point()
                except Exception:  # keep the actor serving; the agent sees the unacknowledged command
                    log.exception("safe point between calls failed")
                finally:
                    self.lock.release()

    @contextlib.contextmanager
    def call(self) -> Iterator[None]:
        """Hold the actor for one call: pending commands run first (a suspend blocks here until resumed)."""
        with self.lock:
            self.workload.safe_point()
            yield

    def close(self) -> None:
        self._stop.set()
        self.workload.close()  # a parked idle thread returns once the workload closes
        if self._idle is not None:
            self._idle.join(timeout=5)


def register_actor(
    *,
    engine: RolloutEngine | None = None,
    level: int = KEEPS_WEIGHTS,
    weights: Callable[[], Weights] | None = None,
    model: torch.nn.Module | None = None,
    optimizer: torch.optim.Optimizer | None = None,
    tensors: Mapping[str, torch.Tensor] | None = None,
    idle_poll_s: float = 0.05,
    **workload_kwargs: Any,
) -> ActorWorkload:
    """Register this actor's process with its pod's node agent (``ROSE_AGENT_SOCKET`` …, or the
    keyword arguments of :class:`rose_sdk.Workload`) and start serving its commands.

    ``engine``: a rollout engine, slept on suspend and woken on resume (``level`` / ``weights`` as
    in :func:`rose_sdk.integrations.rollout.attach`); ``model`` / ``optimizer`` / ``tensors``: a
    trainer's state, offloaded to host memory on suspend. Without a socket nothing registers and
    the calls run unguarded (``workload.connected_to_agent`` is False)."""
    if engine is not None:
        wl = attach(
            engine, level=level, weights=weights, model=model, optimizer=optimizer, tensors=tensors, **workload_kwargs
        )
    else:
        from rose_sdk.workload import Workload

        wl = Workload(model=model, optimizer=optimizer, tensors=tensors, **workload_kwargs)
    return ActorWorkload(wl.start(), idle_poll_s=idle_poll_s)


class _HasRose(Protocol):
    rose: ActorWorkload


S = TypeVar("S", bound=_HasRose)


def rose_method(fn: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
    """Decorate an actor method: it runs inside ``self.rose.call()`` (the actor keeps its
    :class:`ActorWorkload` in ``self.rose``)."""

    def wrapper(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self.rose.call():
            return fn(self, *args, **kwargs)

    functools.update_wrapper(wrapper, fn)
    return wrapper


ENV_PREFIX = "ROSE_"


def actor_env(extra: Mapping[str, str] | None = None) -> dict[str, Any]:
    """A Ray ``runtime_env`` passing this process's ``ROSE_*`` variables (and ``extra``) to an actor:
    for a local Ray outside Kubernetes; in a KubeRay pod the actor inherits them already."""
    env = {k: v for k, v in os.environ.items() if k.startswith(ENV_PREFIX)}
    env.update(extra or {})
    return {"env_vars": env}
