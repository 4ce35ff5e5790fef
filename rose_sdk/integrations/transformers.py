"""A Transformers ``Trainer`` — and every TRL trainer built on it (``GRPOTrainer``, ``DPOTrainer``,
``SFTTrainer``…) — on ROSE, through one ``TrainerCallback``.

    from rose_sdk.integrations.transformers import attach

    trainer = GRPOTrainer(model=..., reward_funcs=..., args=..., train_dataset=...)
    rose = attach(trainer, checkpoint_path="/ckpt/grpo.rose")  # rose_sdk.init(...) + trainer.add_callback
    trainer.train(resume_from_checkpoint=rose.resume_from_checkpoint)  # None unless ROSE_RESTORE found one

What the callback does:

* **Safe point**: the end of every optimizer step (``on_step_end``: after ``optimizer.step()``,
  the scheduler's step and ``zero_grad``, before logging and the trainer's own saves) calls
  ``workload.safe_point(global_step)``; a suspend parks the training thread there.
* **What a suspend moves** (``TrainerOffloader``, read from the trainer at every suspend, so what
  the trainer creates later — the optimizer in ``train()``, Adam's moments at the first step,
  TRL's generations — is included): the model's parameters, gradients and buffers; TRL's
  reference model (``ref_model``, ``beta > 0``); every tensor of the optimizer's state and any
  tensor-valued hyper-parameter in its param groups; the gradient scaler's scale and growth
  tracker (fp16 on CUDA); the trainer's accumulated loss; TRL's buffered generations
  (``_buffered_inputs``: with ``steps_per_generation`` or ``num_iterations`` above 1 they outlive
  an optimizer step — views into one generation batch, cloned into their own storage first so
  the batch's device memory is freed too); and the tensors passed as ``tensors=``.
* **Host state put back on resume**: every RNG (Python, NumPy, torch CPU, each initialised CUDA
  device), the LR scheduler's ``state_dict``, the optimizer's param-group hyper-parameters (the
  learning rate…) and the gradient scaler's ``state_dict`` are snapshotted at the suspend and set
  back before the step after it: whatever else runs in the process while it is parked (hooks,
  world-change callbacks, other threads of the job drawing random numbers) cannot shift the
  resumed run.
* **World change** (an ElasticRLJob grew or shrank): the global batch — per-device batch x
  gradient accumulation x active workers, taken from the first world seen unless
  ``global_batch=`` says — is kept by setting ``args.gradient_accumulation_steps`` to
  ``ceil(global_batch / (per_device_train_batch_size x active))``. When that does not divide, the
  global batch grows to the next multiple of ``per_device_train_batch_size x active`` (a warning
  says by how much; the learning rate is not rescaled). The new value takes effect at the first
  step end where the epoch's micro-batches so far are a multiple of it (else at the next epoch):
  the Trainer decides where an optimizer step ends from ``step % gradient_accumulation_steps``,
  so a change anywhere else would step the optimizer in the middle of an accumulation.
  TRL's ``steps_per_generation`` is left as it is (its dataloader is built with it).
* **Durable checkpoint** (the agent's ``CHECKPOINT`` fallback, ``ROSE_CHECKPOINT_EVERY``,
  ``workload.checkpoint_now()``): the trainer's own checkpoint (``Trainer._save_checkpoint``:
  ``output_dir/checkpoint-<step>`` with the model, ``optimizer.pt``, ``scheduler.pt``, the scaler,
  ``rng_state.pth`` and ``trainer_state.json`` — what ``resume_from_checkpoint`` reads), its files
  fsynced, then the ROSE checkpoint file at ``checkpoint_path`` naming that directory, its files
  and their sizes (the file the agent verifies before it evicts anything). A recreated worker
  (``ROSE_RESTORE=latest``) finds the directory in ``resume_from_checkpoint``. The directory is
  the trainer's ``output_dir``: put it on the same durable volume as ``checkpoint_path``.
  ``s3://`` checkpoint paths hold only the ROSE file, not the trainer's directory: not yet.

Transformers is imported here only: ``import rose_sdk`` does not import it, and importing this
module without it says how to install it (``pip install 'rose-sdk[transformers]'``).
"""

from __future__ import annotations

import copy
import logging
import math
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

try:
    from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
except ModuleNotFoundError as e:  # only transformers itself missing is ours to explain
    if e.name != "transformers":
        raise
    raise ModuleNotFoundError(
        "rose_sdk.integrations.transformers needs Hugging Face Transformers: pip install 'rose-sdk[transformers]'"
        " (or 'rose-sdk[trl]' for TRL's trainers)",
        name="transformers",
    ) from e

from rose_sdk.checkpoint import CheckpointError, get_rng_state, latest_checkpoint, load_checkpoint, set_rng_state
from rose_sdk.offload import CooperativeOffloader
from rose_sdk.workload import Workload, init
from rose_sdk.world import World

log = logging.getLogger("rose.sdk.transformers")

MANIFEST_FORMAT = "rose-transformers-1"


# ---------------------------------------------------------------------- what a suspend moves


def _nested(prefix: str, obj: Any) -> Iterator[tuple[str, torch.Tensor]]:
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, Mapping):
        for k, v in obj.items():
            yield from _nested(f"{prefix}.{k}", v)
    elif isinstance(obj, list | tuple):
        for i, v in enumerate(obj):
            yield from _nested(f"{prefix}[{i}]", v)


def trainer_tensors(trainer: Any) -> Iterator[tuple[str, torch.Tensor]]:
    """Every tensor of a Transformers / TRL trainer's training state, named: the model's (and TRL's
    reference model's) parameters, gradients and buffers, the optimizer's state and tensor-valued
    hyper-parameters, the gradient scaler's tensors, the accumulated loss and TRL's buffered
    generations. Tensors may repeat (tied weights); the offloader moves each once."""
    for prefix, model in (("model", trainer.model), ("ref_model", getattr(trainer, "ref_model", None))):
        if not isinstance(model, torch.nn.Module):
            continue
        for n, p in model.named_parameters():
            yield f"{prefix}.param:{n}", p
            if p.grad is not None:
                yield f"{prefix}.grad:{n}", p.grad
        for n, b in model.named_buffers():
            yield f"{prefix}.buffer:{n}", b
    opt = getattr(trainer, "optimizer", None)
    if opt is not None:
        for i, state in enumerate(opt.state.values()):
            for k, v in state.items():
                if isinstance(v, torch.Tensor):
                    yield f"optimizer.state:{i}:{k}", v
        for i, group in enumerate(opt.param_groups):
            for k, v in group.items():
                if k != "params" and isinstance(v, torch.Tensor):
                    yield f"optimizer.group:{i}:{k}", v
    scaler = getattr(getattr(trainer, "accelerator", None), "scaler", None)
    for k in ("_scale", "_growth_tracker"):
        t = getattr(scaler, k, None)
        if isinstance(t, torch.Tensor):
            yield f"scaler.{k}", t
    loss = getattr(trainer, "_tr_loss", None)
    if isinstance(loss, torch.Tensor):
        yield "trainer.tr_loss", loss
    yield from _nested("trl.buffered_inputs", getattr(trainer, "_buffered_inputs", None))


class TrainerOffloader(CooperativeOffloader):
    """A :class:`CooperativeOffloader` whose tensors are read from ``trainer`` at every offload
    (:func:`trainer_tensors`), plus the ``tensors`` registered by name."""

    def __init__(
        self,
        trainer: Any,
        tensors: Mapping[str, torch.Tensor] | None = None,
        *,
        device: torch.device | str | None = None,
        pin_memory: bool | None = None,
    ) -> None:
        super().__init__(trainer.model, None, tensors, device=device, pin_memory=pin_memory)
        self.trainer = trainer

    def _candidates(self) -> Iterator[torch.Tensor]:
        for _, t in trainer_tensors(self.trainer):
            yield t
        yield from self._named.values()


# ---------------------------------------------------------------------- host state put back on resume


@dataclass
class HostState:
    """What a suspend leaves in host memory but the resumed step depends on."""

    rng: dict[str, Any]
    lr_scheduler: dict[str, Any] | None
    param_groups: list[dict[str, Any]] | None
    scaler: dict[str, Any] | None

    @classmethod
    def capture(cls, trainer: Any) -> HostState:
        sched = getattr(trainer, "lr_scheduler", None)
        opt = getattr(trainer, "optimizer", None)
        scaler = getattr(getattr(trainer, "accelerator", None), "scaler", None)
        groups = None
        if opt is not None:
            groups = [
                {k: copy.deepcopy(v) for k, v in g.items() if k != "params" and not isinstance(v, torch.Tensor)}
                for g in opt.param_groups
            ]
        return cls(
            rng=get_rng_state(),
            lr_scheduler=copy.deepcopy(sched.state_dict()) if sched is not None else None,
            param_groups=groups,
            scaler=copy.deepcopy(scaler.state_dict()) if scaler is not None else None,
        )

    def restore(self, trainer: Any) -> None:
        set_rng_state(self.rng)
        if self.lr_scheduler is not None:
            trainer.lr_scheduler.load_state_dict(copy.deepcopy(self.lr_scheduler))
        if self.param_groups is not None:
            for group, saved in zip(trainer.optimizer.param_groups, self.param_groups, strict=True):
                group.update(copy.deepcopy(saved))
        if self.scaler is not None:
            trainer.accelerator.scaler.load_state_dict(copy.deepcopy(self.scaler))


def _own_storage(obj: Any) -> Any:
    """``obj`` with every tensor that is a view replaced by a copy in its own storage (in place
    for dicts and lists), so offloading the views frees the storage they viewed."""
    if isinstance(obj, torch.Tensor):
        return obj.clone() if obj._base is not None else obj
    if isinstance(obj, dict):
        for k, v in obj.items():
            obj[k] = _own_storage(v)
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            obj[i] = _own_storage(v)
    return obj


# ---------------------------------------------------------------------- durable checkpoint manifest


def _fsync_tree(root: Path) -> dict[str, int]:
    """fsync every file under ``root`` and every directory up to it; {relative path: size}."""
    files: dict[str, int] = {}
    for dirpath, _, names in os.walk(root):
        for name in sorted(names):
            p = Path(dirpath) / name
            with p.open("rb") as f:
                os.fsync(f.fileno())
            files[str(p.relative_to(root))] = p.stat().st_size
        fd = os.open(dirpath, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fd = os.open(root.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return files


def trainer_checkpoint_from(user_state: Any, where: str = "checkpoint") -> str:
    """The trainer checkpoint directory a ROSE checkpoint's manifest names, after checking that
    every file it lists is there with its size; CheckpointError says what is missing."""
    ok = (
        isinstance(user_state, dict)
        and user_state.get("format") == MANIFEST_FORMAT
        and isinstance(user_state.get("trainer_checkpoint"), str)
        and isinstance(user_state.get("files"), dict)
    )
    if not ok:
        raise CheckpointError(f"{where} was not written by rose_sdk.integrations.transformers (no trainer manifest)")
    root = Path(user_state["trainer_checkpoint"])
    for rel, size in user_state["files"].items():
        p = root / rel
        if not p.is_file():
            raise CheckpointError(f"{where} names {root}, but {rel} is missing there (rotated away or not durable?)")
        if p.stat().st_size != size:
            raise CheckpointError(f"{where} names {root}, but {rel} is {p.stat().st_size} bytes, not {size}")
    return str(root)


def latest_trainer_checkpoint(path: str | os.PathLike[str]) -> str | None:
    """The trainer checkpoint directory named by the newest ROSE checkpoint at ``path`` (verified),
    or None when none was written yet: pass it to ``trainer.train(resume_from_checkpoint=...)``."""
    if latest_checkpoint(path) is None:
        return None
    return trainer_checkpoint_from(load_checkpoint(path).user_state, os.fspath(path))


# ---------------------------------------------------------------------- the callback


class RoseTrainerCallback(TrainerCallback):
    """Makes each optimizer step's end a ROSE safe point for ``trainer`` (see the module
    docstring). Made by :func:`attach`, which also creates the workload and adds the callback."""

    def __init__(
        self,
        trainer: Any,
        *,
        global_batch: int | None = None,
        user_state: Callable[[], Any] | None = None,
        close_on_train_end: bool = True,
    ) -> None:
        if global_batch is not None and global_batch < 1:
            raise ValueError(f"global_batch must be >= 1, got {global_batch}")
        self.trainer = trainer
        self.global_batch = global_batch
        self._user_state = user_state
        self.close_on_train_end = close_on_train_end
        self._workload: Workload | None = None
        self._host: HostState | None = None
        self._pending_accumulation: int | None = None
        self._steps_in_epoch = 0
        self._last_step_end: float | None = None
        self.accumulation_changes: list[tuple[int, int]] = []  # (global step, new value) as applied

    @property
    def workload(self) -> Workload:
        if self._workload is None:
            raise RuntimeError("the callback has no workload: create it with rose_sdk.integrations.transformers.attach")
        return self._workload

    def bind(self, workload: Workload) -> None:
        """Use ``workload`` (made with ``offloader=TrainerOffloader(trainer)`` and
        ``user_state=callback.durable_state``): registers the suspend, resume and world hooks."""
        self._workload = workload
        workload.on_suspend(self._before_offload)
        workload.on_resume(self._after_restore)
        workload.on_world_change(self.on_world)

    @property
    def resume_from_checkpoint(self) -> str | None:
        """The trainer checkpoint ``ROSE_RESTORE=latest`` found at the workload's start (verified), else None."""
        ck = self.workload.restored
        if ck is None:
            return None
        return trainer_checkpoint_from(ck.user_state, str(self.workload.checkpoint_path))

    # ------------------------------------------------------------------ suspend / resume hooks

    def _before_offload(self) -> None:
        _own_storage(getattr(self.trainer, "_buffered_inputs", None))
        self._host = HostState.capture(self.trainer)

    def _after_restore(self) -> None:
        if self._host is not None:
            self._host.restore(self.trainer)
            self._host = None

    # ------------------------------------------------------------------ durable checkpoint

    def durable_state(self) -> dict[str, Any]:
        """The trainer's own checkpoint, written and fsynced; returns the manifest the ROSE
        checkpoint file holds (the workload's ``user_state``)."""
        trainer = self.trainer
        trainer._save_checkpoint(trainer.model_wrapped, trial=None)
        root = Path(trainer.args.output_dir) / f"checkpoint-{trainer.state.global_step}"
        manifest: dict[str, Any] = {
            "format": MANIFEST_FORMAT,
            "trainer_checkpoint": str(root.resolve()),
            "global_step": int(trainer.state.global_step),
            "files": _fsync_tree(root),
        }
        if self._user_state is not None:
            manifest["user"] = self._user_state()
        return manifest

    # ------------------------------------------------------------------ world change

    def on_world(self, world: World) -> None:
        """A new world: keep the global batch by changing gradient accumulation (from the next
        aligned step end on). A world with no active worker (the job's workers all suspended, as the
        controller reports while this one is parked suspended) has no batch to split: nothing changes."""
        if world.active < 1:
            log.info("world without active workers: gradient accumulation kept", extra={"world": str(world)})
            return
        args = self.trainer.args
        per = int(args.per_device_train_batch_size)
        if self.global_batch is None:
            self.global_batch = per * int(args.gradient_accumulation_steps) * world.active
            log.info("global batch taken from the first world", extra={"globalBatch": self.global_batch})
        want = max(1, math.ceil(self.global_batch / (per * world.active)))
        got = want * per * world.active
        if got != self.global_batch:
            log.warning(
                "the global batch does not divide over the active workers; it grows",
                extra={"globalBatch": self.global_batch, "now": got, "world": str(world)},
            )
        current = self._pending_accumulation or int(args.gradient_accumulation_steps)
        if want != current:
            self._pending_accumulation = want if want != int(args.gradient_accumulation_steps) else None

    def _apply_accumulation(self, args: TrainingArguments, state: TrainerState, *, epoch_start: bool) -> None:
        want = self._pending_accumulation
        if want is None:
            return
        n = self._steps_in_epoch
        done = 0 if epoch_start or n <= 0 else round(state.epoch * n) % n
        if done % want:
            return  # the Trainer would end an optimizer step mid-accumulation: wait
        args.gradient_accumulation_steps = want
        self._pending_accumulation = None
        self.accumulation_changes.append((int(state.global_step), want))
        log.info("gradient accumulation changed", extra={"step": state.global_step, "gradientAccumulation": want})

    # ------------------------------------------------------------------ TrainerCallback

    def on_train_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        dl = kwargs.get("train_dataloader")
        try:
            self._steps_in_epoch = len(dl) if dl is not None else 0
        except TypeError:  # an iterable dataset: the Trainer counts max_steps x accumulation per epoch
            self._steps_in_epoch = int(args.max_steps) * int(args.gradient_accumulation_steps)
        self._last_step_end = time.monotonic()

    def on_epoch_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        self._apply_accumulation(args, state, epoch_start=True)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any) -> None:
        wl = self.workload
        now = time.monotonic()
        step_s = now - self._last_step_end if self._last_step_end is not None else 0.0
        wl.report("train", seconds_to_safe_point=step_s, steps=int(state.global_step))
        wl.safe_point(int(state.global_step))
        self._apply_accumulation(args, state, epoch_start=False)
        self._last_step_end = time.monotonic()

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **kwargs: Any
    ) -> None:
        if self.close_on_train_end and self._workload is not None:
            self._workload.close()


def attach(
    trainer: Any,
    *,
    tensors: Mapping[str, torch.Tensor] | None = None,
    global_batch: int | None = None,
    user_state: Callable[[], Any] | None = None,
    close_on_train_end: bool = True,
    **init_kwargs: Any,
) -> RoseTrainerCallback:
    """Put ``trainer`` on ROSE: ``rose_sdk.init(**init_kwargs)`` with a :class:`TrainerOffloader`
    and the trainer's checkpoint as the durable one, and ``trainer.add_callback`` of the
    :class:`RoseTrainerCallback` returned. ``init_kwargs``: ``checkpoint_path``, ``socket_path``,
    ``pod_uid``…, ``report_interval_s`` (not ``model``, ``optimizer``, ``offloader``: the trainer's
    are used). ``tensors``: other device tensors to move on a suspend. ``user_state``: saved in the
    durable checkpoint's manifest besides (``workload.restored.user_state["user"]``)."""
    clash = sorted({"model", "optimizer", "offloader"} & init_kwargs.keys())
    if clash:
        raise TypeError(f"attach() takes the trainer's own {', '.join(clash)}; do not pass them")
    cb = RoseTrainerCallback(
        trainer, global_batch=global_batch, user_state=user_state, close_on_train_end=close_on_train_end
    )
    wl = init(offloader=TrainerOffloader(trainer, tensors), user_state=cb.durable_state, **init_kwargs)
    cb.bind(wl)
    trainer.add_callback(cb)
    return cb
