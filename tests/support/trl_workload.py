"""TRL's real GRPOTrainer on the tiny model (``examples/02_grpo_tiny_llm/tiny_grpo.py``), on ROSE through
``rose_sdk.integrations.transformers.attach``: the workload process of the integration tests.

    python tests/support/trl_workload.py --out R.pt --max-steps 6 [--gate-dir D --gates 1,3] [--next-tenant REPORT.json]
                                 [--checkpoint P] [--exit-after-checkpoint] [--skip PIECE]

``--gates``: at the end of each listed step (after ROSE's safe point) the job prints
``GATE <step>`` and waits for the file ``D/go-<step>`` — the test asks the agent for a suspend,
then opens the gate, so the suspend lands at the next step's safe point, mid-training.
``--next-tenant``: the GPU's next tenant simulated at every suspend (``tests/support/next_tenant.py``):
every tensor of the job, enumerated here independently of the integration, must have left its
storage, which is then overwritten with NaN bytes; and the host state the integration promises to
put back is garbled while parked (every RNG drawn from, the LR scheduler stepped, the learning
rate overwritten). ``--skip rng|scheduler|optimizer|buffered|ref_model``: the integration with
that one piece left out (the check that the bit-identity test catches it). ``--beta`` (default
0.04): the KL coefficient; above 0 TRL keeps a reference model, loaded from the tiny model saved
to a path. ``--exit-after-checkpoint``: exit 3 right after the first durable checkpoint (a lost
worker). ``--rollout-service``: the trainer role of example 02 — TRL takes its completions from a
rollout service on loopback (``rose_sdk.rollout_service``; the token in ``ROSE_ROLLOUT_TOKEN``;
prints ``ROLLOUT_SERVICE host:port``) instead of generating in-process; ``--rollout-threads K``
runs K rollout workers as threads of this process (else they are other processes: example 02's
``--role rollout``). At the end it prints ``ROLLOUT_COUNTERS {json}``. Writes to ``--out`` the
final model, optimizer and scheduler states, every RNG, the losses and the accumulation per step.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE), str(HERE.parents[1] / "examples" / "02_grpo_tiny_llm")]

# TRL 1.16's generation helper (trl/models/utils.py, _unwrap_model_for_generation) reads
# `is_gradient_checkpointing`, which Transformers 5.24 deprecates; nothing here can avoid it.
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)


def _skip(piece: str) -> None:
    """Leave one piece out of the integration (to see the bit-identity test catch it)."""
    from rose_sdk.integrations import transformers as rt

    if piece in ("rng", "scheduler"):
        original = rt.HostState.restore

        def restore(self: Any, trainer: Any) -> None:
            if piece == "rng":
                self.rng = rt.get_rng_state()  # put back what is there now: nothing
            else:
                self.lr_scheduler, self.param_groups = None, None
            original(self, trainer)

        rt.HostState.restore = restore  # type: ignore[method-assign]
    elif piece in ("optimizer", "buffered", "ref_model"):
        prefix = {"optimizer": "optimizer.", "buffered": "trl.buffered_inputs", "ref_model": "ref_model."}[piece]
        tensors = rt.trainer_tensors

        def trainer_tensors(trainer: Any) -> Any:
            return ((n, t) for n, t in tensors(trainer) if not n.startswith(prefix))

        rt.trainer_tensors = trainer_tensors
    else:
        raise SystemExit(f"--skip {piece}: unknown piece")


def _grpo_rollout_func(service: Any) -> Any:
    from rose_sdk.integrations.rollout_worker import grpo_rollout_func

    return grpo_rollout_func(service, timeout_s=240)


def _rollout(a: Any, tiny_grpo: Any) -> Any:
    """The rollout service (and ``--rollout-threads`` workers as threads of this process)."""
    import threading

    from rose_sdk.integrations.rollout_worker import RolloutWorker
    from rose_sdk.rollout_service import RolloutClient, RolloutService, token_from_env

    os.environ["TRL_EXPERIMENTAL_SILENCE"] = "1"  # rollout_func is "experimental" in TRL 1.16
    service = RolloutService(token=token_from_env(), job_seed=a.seed, lease_s=30).start()
    print(f"ROLLOUT_SERVICE {service.address}", flush=True)
    for i in range(a.rollout_threads):
        engine = tiny_grpo.engine(a.seed)
        client = RolloutClient(service.address, worker=f"thread{i}")
        w = RolloutWorker(
            client, engine, max_new_tokens=tiny_grpo.MAX_COMPLETION, eos_token_id=engine.tokenizer.eos_token_id
        )
        threading.Thread(target=w.run, name=f"rollout{i}", daemon=True).start()
    return service


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--max-steps", type=int, default=6)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--num-iterations", type=int, default=2)
    p.add_argument("--beta", type=float, default=0.04)  # > 0: TRL's reference model is part of the state
    p.add_argument("--gradient-accumulation", type=int, default=1)
    p.add_argument("--gate-dir", default="")
    p.add_argument("--gates", default="")
    p.add_argument("--next-tenant", default="")
    p.add_argument("--checkpoint", default=None)
    p.add_argument("--exit-after-checkpoint", action="store_true")
    p.add_argument("--skip", default="")
    p.add_argument("--rollout-service", action="store_true")
    p.add_argument("--rollout-threads", type=int, default=0)
    a = p.parse_args(argv)

    import numpy as np
    import tiny_grpo
    import torch
    from transformers import TrainerCallback

    from rose_sdk.integrations import transformers as rt
    from tests.support.next_tenant import NextTenant

    torch.set_num_threads(1)
    if a.skip:
        _skip(a.skip)
    out_dir = str(Path(a.out).with_suffix(".trainer"))
    service = _rollout(a, tiny_grpo) if a.rollout_service else None
    trainer = tiny_grpo.trainer(
        out_dir,
        max_steps=a.max_steps,
        seed=a.seed,
        beta=a.beta,
        num_iterations=a.num_iterations,
        gradient_accumulation_steps=a.gradient_accumulation,
        steps_per_generation=1,
        rollout_func=None if service is None else _grpo_rollout_func(service),
    )
    rose = rt.attach(trainer, checkpoint_path=a.checkpoint)
    wl = rose.workload
    tenants: list[NextTenant] = []
    if a.next_tenant:
        # Enumerated here, not by the integration: the model, the optimizer, TRL's reference model
        # and buffered generations, the accumulated loss (registered after attach: its hooks run first).
        def named() -> dict[str, torch.Tensor]:
            out: dict[str, torch.Tensor] = {"tr_loss": trainer._tr_loss}
            if trainer.ref_model is not None:
                out.update({f"ref.{k}": v for k, v in trainer.ref_model.named_parameters()})
            for i, batch in enumerate(trainer._buffered_inputs or []):
                out.update({f"buffered{i}.{k}": v for k, v in batch.items() if isinstance(v, torch.Tensor)})
            return out

        def before() -> None:
            t = NextTenant(trainer.model, trainer.optimizer, named(), wl.offloader.device)
            t.before_offload()
            tenants.append(t)

        def garble_host() -> None:
            random.random(), np.random.rand(), torch.rand(3)  # the process's RNGs move on
            trainer.lr_scheduler.step()
            for g in trainer.optimizer.param_groups:
                g["lr"] = 123.0

        wl.on_suspend(before)
        wl.on_suspended(lambda: (tenants[-1].while_suspended(), garble_host()))

    gates = {int(s) for s in a.gates.split(",") if s}
    per_step: list[int] = []

    class Probe(TrainerCallback):
        micro = 0

        def on_substep_end(self, *args: Any, **kw: Any) -> None:
            self.micro += 1

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            per_step.append(self.micro + 1)
            self.micro = 0
            if a.exit_after_checkpoint and wl.last_checkpoint is not None:
                print(f"CHECKPOINTED {state.global_step}", flush=True)
                os._exit(3)
            if state.global_step in gates:
                print(f"GATE {state.global_step}", flush=True)
                go = Path(a.gate_dir) / f"go-{state.global_step}"
                end = time.monotonic() + 120
                while not go.exists():
                    if time.monotonic() > end:
                        raise SystemExit(f"gate {go} never opened")
                    time.sleep(0.01)

        def on_train_begin(self, *args: Any, **kw: Any) -> None:
            print(f"READY {os.getpid()} step={trainer.state.global_step}", flush=True)

    trainer.add_callback(Probe())
    resume = rose.resume_from_checkpoint
    if resume:
        print(f"RESUMING {resume}", flush=True)
    trainer.train(resume_from_checkpoint=resume)
    print(f"DONE suspends={wl.suspend_count} resumes={wl.resume_count}", flush=True)
    if service is not None:
        service.finish()
        service.wait_drained(60)  # every connected worker told "done" before this process exits
        print(f"ROLLOUT_COUNTERS {json.dumps(service.status())}", flush=True)
        import threading

        # the worker threads end on "done": joined, not left as daemons inside torch at interpreter
        # exit (a CI run aborted there: "terminate called without an active exception", rc -6)
        for t in threading.enumerate():
            if t.name.startswith("rollout") and t is not threading.current_thread():
                t.join(timeout=60)
    torch.save(
        {
            "model": {k: v.clone() for k, v in trainer.model.state_dict().items()},
            "optimizer": trainer.optimizer.state_dict(),
            "scheduler": trainer.lr_scheduler.state_dict(),
            "rng": rt.get_rng_state(),
            "losses": [h["loss"] for h in trainer.state.log_history if "loss" in h],
            "micro_batches_per_step": per_step,
            "accumulation_changes": rose.accumulation_changes,
            "global_step": trainer.state.global_step,
        },
        a.out,
    )
    if a.next_tenant:
        import dataclasses

        records = [dataclasses.asdict(r) for t in tenants for r in t.records]
        Path(a.next_tenant).write_text(json.dumps({"suspends": records}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
