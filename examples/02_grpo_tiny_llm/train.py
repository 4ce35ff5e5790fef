"""Example 02: GRPO on a tiny LLM with TRL's real GRPOTrainer, on ROSE.

A 2-layer Qwen2-architecture model built from a config (random weights, no download) learns to
answer a prompt of 4 digits with one digit repeated (``tiny_grpo.py``; the reward is the share of
the 8 completion tokens its most repeated digit takes): TRL generates the completions in-process,
scores them, and takes GRPO steps; the reward goes from about 0.4 to 1.0 in 60 steps. One call puts the trainer on ROSE:
``rose_sdk.integrations.transformers.attach`` makes the end of every optimizer step a safe point
where the node agent can suspend the job into host memory and resume it bit-exact, keeps the
global batch when an elastic job's world changes, and writes the trainer's own checkpoint as the
durable one. Without ROSE_AGENT_SOCKET it runs uninterrupted: the same script everywhere.

    pip install './sdk[trl]'    # or, in this repository: the venv of hack/setup.sh
    python examples/02_grpo_tiny_llm/train.py --max-steps 60 --out /tmp/grpo

CPU only as written (``use_cpu=True``); about 0.03-0.1 s a step on a laptop core.

Roles (``--role``, else ``ROSE_ROLE``, else ``all``): ``all`` is the above, one process.
``trainer`` runs the same GRPOTrainer, but its completions come from elastic rollout workers
through the rollout service it serves on ``--bind``:``--port`` (``rose_sdk.rollout_service``; the
job's token in ``ROSE_ROLLOUT_TOKEN`` / ``ROSE_ROLLOUT_TOKEN_FILE``). ``rollout`` is one worker:
it pulls the weights from ``ROSE_TRAINER_ADDR`` (host:port), leases prompts, generates each with
its own seed, returns the completions, and exits when the trainer is done. Any number of workers
may come and go; the trained weights are the same bit for bit.

    export ROSE_ROLLOUT_TOKEN=$(python -c 'import secrets; print(secrets.token_hex(16))')
    python examples/02_grpo_tiny_llm/train.py --role trainer --out /tmp/grpo --port 8470 &
    ROSE_TRAINER_ADDR=127.0.0.1:8470 python examples/02_grpo_tiny_llm/train.py --role rollout &
    ROSE_TRAINER_ADDR=127.0.0.1:8470 python examples/02_grpo_tiny_llm/train.py --role rollout
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent.parent), str(HERE)]  # run from a checkout

# TRL 1.16 reads `is_gradient_checkpointing`, which Transformers 5.24 deprecates (a FutureWarning
# at every generation); the job cannot avoid it.
warnings.filterwarnings("ignore", message="`is_gradient_checkpointing` is deprecated", category=FutureWarning)
os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # rollout_func is "experimental" in TRL 1.16


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    roles = ("all", "trainer", "rollout")
    p.add_argument(
        "--role",
        choices=roles,
        default=os.environ.get("ROSE_ROLE") or "all",
        help="all: one process; trainer: completions from rollout workers; rollout: a worker",
    )
    p.add_argument("--out", help="the trainer's output_dir (its checkpoints go there); roles all and trainer")
    p.add_argument("--max-steps", type=int, default=60)
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--checkpoint", default=None, help="the ROSE checkpoint file (else ROSE_CHECKPOINT_PATH)")
    p.add_argument(
        "--bind",
        default=os.environ.get("ROSE_POD_IP") or "127.0.0.1",
        help="trainer: the address the rollout service binds (the pod IP: ROSE_POD_IP)",
    )
    p.add_argument("--port", type=int, default=8470, help="trainer: the rollout service's port (0: any free one)")
    p.add_argument("--lease-s", type=float, default=60.0, help="trainer: a lease's lifetime without a completion")
    p.add_argument("--batch", type=int, default=4, help="rollout: prompts per lease")
    p.add_argument("--trainer-wait-s", type=float, default=120.0, help="rollout: how long to wait for the trainer")
    a = p.parse_args(argv)
    if a.role != "rollout" and not a.out:
        p.error(f"--out is required for --role {a.role}")

    import torch

    torch.set_num_threads(1)
    if a.role == "rollout":
        return rollout(a)
    return train(a)


def train(a: argparse.Namespace) -> int:
    import tiny_grpo

    from rose_sdk.integrations.transformers import attach

    service = None
    rollout_func = None
    if a.role == "trainer":
        from rose_sdk.integrations.rollout_worker import grpo_rollout_func
        from rose_sdk.rollout_service import RolloutService, token_from_env

        service = RolloutService(token=token_from_env(), host=a.bind, port=a.port, job_seed=a.seed, lease_s=a.lease_s)
        service.start()
        print(f"ROLLOUT_SERVICE {service.address}", flush=True)
        rollout_func = grpo_rollout_func(service)
    trainer = tiny_grpo.trainer(a.out, max_steps=a.max_steps, seed=a.seed, disable_tqdm=True, rollout_func=rollout_func)
    rose = attach(trainer, checkpoint_path=a.checkpoint)
    try:
        trainer.train(resume_from_checkpoint=rose.resume_from_checkpoint)
    finally:
        if service is not None:
            service.finish()
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    k = max(1, len(rewards) // 5)
    first, last = sum(rewards[:k]) / k, sum(rewards[-k:]) / k
    wl = rose.workload
    print(
        f"steps={trainer.state.global_step} reward first {k}: {first:.3f} last {k}: {last:.3f}"
        f" suspends={wl.suspend_count} resumes={wl.resume_count}"
    )
    if service is not None:
        c = service.queue.counters
        print(
            f"rollout: submitted={c.submitted} accepted={c.accepted} duplicate={c.duplicate} stale={c.stale}"
            f" requeued={c.requeued_release + c.requeued_disconnect + c.requeued_expired}"
            f" weight_pulls={service.stats.weight_pulls}",
            flush=True,
        )
        service.wait_drained(60)  # let the connected workers see "done" before the service goes
        service.close()
    return 0


def rollout(a: argparse.Namespace) -> int:
    import signal
    import socket
    import time

    import tiny_grpo

    from rose_sdk.integrations.rollout import init_rollout
    from rose_sdk.integrations.rollout_worker import RolloutWorker
    from rose_sdk.rollout_service import RolloutClient, RolloutError

    name = os.environ.get("ROSE_POD_NAME") or f"{socket.gethostname()}-{os.getpid()}"
    client = RolloutClient(worker=name)
    deadline = time.monotonic() + a.trainer_wait_s
    while True:  # the trainer may start after its workers
        try:
            client.version()
            break
        except RolloutError as e:
            if time.monotonic() > deadline:
                print(f"rollout: the trainer at {client.host}:{client.port} did not answer: {e}", file=sys.stderr)
                return 1
            time.sleep(1.0)
    engine = tiny_grpo.engine(a.seed)
    wl = init_rollout(engine, level=1)
    worker = RolloutWorker(
        client,
        engine,
        batch=a.batch,
        max_new_tokens=tiny_grpo.MAX_COMPLETION,
        eos_token_id=engine.tokenizer.eos_token_id,
        workload=wl,
    )
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        st = worker.run(stop)
    finally:
        wl.close()
        client.close()
    print(
        f"rollout {name}: samples={st.samples} pulls={st.weight_pulls} released={st.released}"
        f" first_sample_s={st.first_sample_s} loop_cpu_s={st.loop_cpu_s:.2f}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
