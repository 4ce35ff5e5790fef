"""A rollout engine on Hugging Face Transformers' ``generate`` (any causal LM; runs on the CPU too).

``TransformersGenerateEngine(model, tokenizer)`` implements
:class:`rose_sdk.integrations.rollout.RolloutEngine`:

* ``sleep(1)`` parks every parameter and buffer in one host arena
  (:class:`rose_sdk.CooperativeOffloader`: pinned on CUDA, tensors re-pointed, device memory
  freed); ``wake()`` copies them back, bit-exact.
* ``sleep(2)`` drops the parameters (empty tensors: nothing kept anywhere) and parks only the
  buffers (rotary tables and the like, which a ``state_dict`` may not hold); ``wake()`` gives the
  parameters fresh device memory filled with NaN, and ``generate`` refuses to run until
  ``load_weights`` has written every one of them — a wake that skipped the reload cannot sample.
* ``generate(prompts, seeds)`` draws each prompt's sample with its own ``torch.Generator`` seeded
  with that prompt's seed: ``generate`` runs greedy over a logits processor that samples each row
  from its own generator (temperature ``temperature``, full vocabulary), so a prompt's draws do
  not depend on the other prompts. With ``batch_invariant=True`` (the default) each prompt is
  generated alone, so its tokens are bit-identical whatever batch it came in; with ``False`` the
  prompts go as one left-padded batch (faster; the logits of a row can then differ in the last
  bits with the batch's size and padding, and a near-tie can change a sampled token).

Transformers is imported when ``generate`` runs, not at import.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from rose_sdk.integrations.rollout import (
    DROPS_WEIGHTS,
    KEEPS_WEIGHTS,
    Sample,
    Weights,
    check_level,
    check_seeds,
    weight_items,
)
from rose_sdk.offload import CooperativeOffloader


class PerRowSampler:
    """A logits processor that samples row ``i`` from ``generators[i]`` and leaves only that token
    possible (the greedy step after it picks it)."""

    def __init__(self, generators: Sequence[torch.Generator], temperature: float) -> None:
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.generators = list(generators)
        self.temperature = temperature

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        out = torch.full_like(scores, float("-inf"))
        for i, g in enumerate(self.generators):
            probs = torch.softmax(scores[i].float() / self.temperature, dim=-1)
            tok = torch.multinomial(probs, 1, generator=g)
            out[i, tok] = 0.0
        return out


class TransformersGenerateEngine:
    """``model``: a Transformers causal LM (``PreTrainedModel`` with ``generate``) on its device;
    ``tokenizer``: its tokenizer (a ``PreTrainedTokenizerFast``; needs a pad or eos token)."""

    def __init__(self, model: Any, tokenizer: Any, *, batch_invariant: bool = True) -> None:
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.batch_invariant = batch_invariant
        self.device: torch.device = next(iter(model.parameters())).device
        self._level = 0  # 0 awake, else the level it sleeps at
        self._dropped: list[tuple[torch.nn.Parameter, torch.Size, torch.dtype]] = []
        self._unloaded: set[int] = set()  # ids of parameters not yet written after a level-2 wake
        self._params = self._unique(model.parameters())
        self._all = CooperativeOffloader(model, device=self.device)
        self._buffers = CooperativeOffloader(
            tensors={f"buffer{i}": b for i, b in enumerate(self._unique(model.buffers()))}, device=self.device
        )
        self._parking: CooperativeOffloader | None = None

    @staticmethod
    def _unique(ts: Any) -> list[Any]:
        seen: set[int] = set()
        out = []
        for t in ts:
            if id(t) not in seen:
                seen.add(id(t))
                out.append(t)
        return out

    # ------------------------------------------------------------------ RolloutEngine

    @property
    def sleeping(self) -> bool:
        return self._level != 0

    @property
    def needs_weights(self) -> bool:
        """Awake after a level-2 sleep and not every parameter reloaded yet."""
        return bool(self._unloaded)

    def device_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in [*self._params, *self._unique(self.model.buffers())])

    def sleep(self, level: int = KEEPS_WEIGHTS) -> None:
        check_level(level)
        if self.sleeping:
            return
        if level == KEEPS_WEIGHTS:
            self._all.offload()
            self._parking = self._all
        else:
            self._buffers.offload()
            self._parking = self._buffers
            self._dropped = [(p, p.shape, p.dtype) for p in self._params]
            for p, _, dtype in self._dropped:
                p.data = torch.empty(0, dtype=dtype, device=self.device)
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
        self._level = level

    def wake(self) -> None:
        if not self.sleeping:
            return
        assert self._parking is not None
        self._parking.restore()
        if self._level == DROPS_WEIGHTS:
            for p, shape, dtype in self._dropped:
                p.data = torch.full(shape, float("nan"), dtype=dtype, device=self.device)
            self._unloaded = {id(p) for p, _, _ in self._dropped}
            self._dropped = []
        self._parking = None
        self._level = 0

    def load_weights(self, weights: Weights) -> None:
        """Copy ``weights`` (a ``state_dict`` or ``(name, tensor)`` pairs; tied names both work)
        into the model's parameters and buffers. Unknown names raise KeyError."""
        if self.sleeping:
            raise RuntimeError("the engine sleeps: wake() before load_weights")
        named: dict[str, torch.Tensor] = dict(self.model.named_parameters(remove_duplicate=False))
        named.update(self.model.named_buffers(remove_duplicate=False))
        unknown: list[str] = []
        with torch.no_grad():
            for name, t in weight_items(weights):
                target = named.get(name)
                if target is None:
                    unknown.append(name)
                    continue
                target.copy_(t)
                self._unloaded.discard(id(target))
        if unknown:
            raise KeyError(
                f"weights for names the model does not have: {unknown[:5]}{' …' if len(unknown) > 5 else ''}"
            )

    def generate(
        self, prompts: Sequence[str], seeds: Sequence[int], *, max_new_tokens: int = 16, temperature: float = 1.0
    ) -> list[Sample]:
        check_seeds(prompts, seeds)
        if self.sleeping:
            raise RuntimeError("the engine sleeps: wake() before generate")
        if self._unloaded:
            raise RuntimeError(
                f"{len(self._unloaded)} parameters were dropped at sleep level 2 and not reloaded: "
                "load_weights after wake"
            )
        if self.batch_invariant:
            out: list[Sample] = []
            for p, s in zip(prompts, seeds, strict=True):
                out.extend(self._generate([p], [s], max_new_tokens, temperature))
            return out
        return self._generate(list(prompts), list(seeds), max_new_tokens, temperature)

    # ------------------------------------------------------------------ generation

    def _generate(self, prompts: list[str], seeds: list[int], max_new_tokens: int, temperature: float) -> list[Sample]:
        from transformers import GenerationConfig, LogitsProcessorList

        tok = self.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        enc = tok(prompts, return_tensors="pt", padding=True, padding_side="left").to(self.device)
        gens = [torch.Generator(device=self.device).manual_seed(int(s)) for s in seeds]
        cfg = GenerationConfig(  # type: ignore[no-untyped-call]
            do_sample=False,
            max_new_tokens=max_new_tokens,
            pad_token_id=pad,
            eos_token_id=tok.eos_token_id,
            bos_token_id=tok.bos_token_id,
        )
        with torch.inference_mode():
            ids = self.model.generate(
                **enc,
                generation_config=cfg,
                logits_processor=LogitsProcessorList([PerRowSampler(gens, temperature)]),
            )
        new = ids[:, enc["input_ids"].shape[1] :].tolist()
        out: list[Sample] = []
        for p, s, row in zip(prompts, seeds, new, strict=True):
            if tok.eos_token_id is not None and tok.eos_token_id in row:
                row = row[: row.index(tok.eos_token_id)]
            out.append(Sample(p, int(s), tuple(row), tok.decode(row, skip_special_tokens=True)))
        return out
