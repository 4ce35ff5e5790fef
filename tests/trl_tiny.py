"""A tiny GRPO job for the Transformers / TRL integration tests: no model hub, no download.

A 2-layer Qwen2-architecture causal LM with random weights built from a config (about 87k
parameters), a one-character-per-token tokenizer built with ``tokenizers``, prompts that are
strings of digits, and a reward for completions that repeat the prompt's first digit. TRL's real
``GRPOTrainer`` generates in-process (``use_vllm=False``) on the CPU. Test support only: the
trainer writes under ``output_dir``; nothing else is touched.
"""

from __future__ import annotations

import random
from typing import Any

VOCAB = ["<pad>", "<eos>", *"0123456789 "]


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


def repeat_first_digit(prompts: list[str], completions: list[str], **_: Any) -> list[float]:
    """The share of the completion's characters that equal the prompt's first digit."""
    return [sum(c == p[0] for c in comp) / max(len(comp), 1) for p, comp in zip(prompts, completions, strict=True)]


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
        "max_completion_length": 8,
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


def trainer(output_dir: str, *, max_steps: int, seed: int = 7, beta: float = 0.0, **overrides: Any) -> Any:
    """TRL's GRPOTrainer on the tiny model. ``beta`` > 0 adds the KL term and so TRL's reference
    model, which TRL loads from a path: the tiny model is saved under ``output_dir/init`` first."""
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
        reward_funcs=repeat_first_digit,
        args=config(output_dir, max_steps=max_steps, seed=seed, beta=beta, **overrides),
        train_dataset=dataset(),
        processing_class=tokenizer(),
    )
