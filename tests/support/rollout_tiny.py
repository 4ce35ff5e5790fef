"""A tiny causal LM for the rollout-engine tests: no model hub, no download.

A 2-layer Qwen2-architecture model with random weights built from a config, a one-character-per-
token tokenizer built locally with ``tokenizers`` (lower-case letters, digits, space, pad, eos).
``save`` writes both to a folder in the Hugging Face layout, which vLLM and SGLang load from a
local path (the device tier). Test support only.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

VOCAB = ["<pad>", "<eos>", *"abcdefghijklmnopqrstuvwxyz0123456789 "]
PROMPTS = ["the cat", "a dog ran", "42", "hello world", "rl on idle gpus", "x"]


def tokenizer() -> Any:
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(VOCAB)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", padding_side="left")


def model(seed: int = 0, *, hidden: int = 64, layers: int = 2) -> Any:
    """The tiny Qwen2 model with random weights drawn from ``seed`` (float32, on the CPU)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(
        vocab_size=len(VOCAB),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    m = Qwen2ForCausalLM(cfg)
    with torch.no_grad():  # the default init is small: scale the logits up so samples vary
        m.lm_head.weight.mul_(20.0)
    return m


def save(folder: Path, seed: int = 0) -> Path:
    """Model and tokenizer in the Hugging Face layout under ``folder`` (for vLLM / SGLang)."""
    model(seed).save_pretrained(folder)
    tokenizer().save_pretrained(folder)
    return folder
