"""The tiny GRPO job of example 02 (and of the Transformers / TRL integration tests): no model
hub, no download.

A 2-layer Qwen2-architecture causal LM with random weights built from a config (19k parameters),
a one-character-per-token tokenizer built with ``tokenizers``, prompts of 4 random digits, and a
reward for completions that repeat one digit (the share of the completion it takes). TRL's real
``GRPOTrainer`` generates in-process (``use_vllm=False``) on the CPU. The trainer writes under
``output_dir`` only.
"""

from __future__ import annotations

import random
from typing import Any

VOCAB = ["<pad>", "<eos>", *"0123456789 "]
MAX_COMPLETION = 8  # tokens per completion


def tokenizer() -> Any:
    """A PreTrainedTokenizerFast with one token per character (digits and space), pad and eos."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", padding_side="left")


def model(seed: int) -> Any:
    """The tiny Qwen2 model with random weights drawn from ``seed``."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=len(VOCAB),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
        tie_word_embeddings=True,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(cfg)


def dataset(n: int = 64, seed: int = 0) -> Any:
    """``n`` prompts of 4 random digits."""
    from datasets import Dataset

    rng = random.Random(seed)
    return Dataset.from_dict({"prompt": ["".join(rng.choice("0123456789") for _ in range(4)) for _ in range(n)]})


def repeated_digit(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    """The share of the completion's ``MAX_COMPLETION`` tokens taken by its most repeated digit
    (1.0: one digit, repeated to the end)."""
    del prompts
    return [max((comp.count(d) for d in "0123456789"), default=0) / MAX_COMPLETION for comp in completions]


def config(output_dir: str, *, max_steps: int, seed: int = 7, **overrides: Any) -> Any:
    """GRPOConfig for the CPU: 8 completions of 8 tokens per step, no vLLM, no logging to files."""
    from trl import GRPOConfig

    kw: dict[str, Any] = {
        "output_dir": output_dir,
        "use_cpu": True,
        "use_vllm": False,
        "max_steps": max_steps,
        "per_device_train_batch_size": 8,
        "num_generations": 4,
        "max_completion_length": MAX_COMPLETION,
        "learning_rate": 1e-2,
        "seed": seed,
        "data_seed": seed,
        "logging_steps": 1,
        "save_strategy": "no",
        "report_to": "none",
        "activation_checkpointing": False,
        "disable_tqdm": True,
        "bf16": False,
        "dataloader_num_workers": 0,
    }
    kw.update(overrides)
    return GRPOConfig(**kw)


def trainer(
    output_dir: str, *, max_steps: int, seed: int = 7, beta: float = 0.0, rollout_func: Any = None, **overrides: Any
) -> Any:
    """TRL's GRPOTrainer on the tiny model. ``beta`` > 0 adds the KL term and so TRL's reference
    model, which TRL loads from a path: the tiny model is saved under ``output_dir/init`` first.
    ``rollout_func``: TRL's generation hook (the rollout service's
    ``rose_sdk.integrations.rollout_worker.grpo_rollout_func``) instead of in-process generation."""
    from pathlib import Path

    from trl import GRPOTrainer

    policy: Any = model(seed)
    if beta:
        init = Path(output_dir) / "init"
        policy.save_pretrained(init)
        tokenizer().save_pretrained(init)
        policy = str(init)
    return GRPOTrainer(
        model=policy,
        reward_funcs=repeated_digit,
        args=config(output_dir, max_steps=max_steps, seed=seed, beta=beta, **overrides),
        train_dataset=dataset(),
        processing_class=tokenizer(),
        rollout_func=rollout_func,
    )


def engine(seed: int = 7) -> Any:
    """A rollout worker's engine: the tiny model (its weights are replaced by the trainer's at the
    first pull) behind ``TransformersGenerateEngine``, batch-invariant."""
    from rose_sdk.integrations.transformers_generate import TransformersGenerateEngine

    return TransformersGenerateEngine(model(seed), tokenizer(), batch_invariant=True)
