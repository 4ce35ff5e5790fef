"""The Transformers ``generate`` rollout engine on the CPU (a tiny random Qwen2, no download): per-prompt
seeds independent of the batch, sleep / wake bit-exact at level 1, level 2 refusing to sample until
the weights are reloaded, and the offloader that plugs an engine into the SDK's suspend / resume."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from rose_sdk import tensors_equal
from rose_sdk.integrations.rollout import EngineOffloader, RolloutEngine
from rose_sdk.integrations.transformers_generate import TransformersGenerateEngine
from tests.support import rollout_tiny

PROMPTS = rollout_tiny.PROMPTS


@pytest.fixture(scope="module")
def tok() -> Any:
    return rollout_tiny.tokenizer()


def _engine(tok: Any, **kw: Any) -> TransformersGenerateEngine:
    return TransformersGenerateEngine(rollout_tiny.model(0), tok, **kw)


def _state(e: TransformersGenerateEngine) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in e.model.state_dict().items()}


@pytest.mark.parametrize("batch_invariant", [True, False], ids=["one-by-one", "batched"])
def test_same_prompt_same_seed_same_tokens_whatever_the_batch(tok: Any, batch_invariant: bool) -> None:
    e = _engine(tok, batch_invariant=batch_invariant)
    seeds = [100 + i for i in range(len(PROMPTS))]
    full = e.generate(PROMPTS, seeds, max_new_tokens=12)
    alone = [e.generate([p], [s], max_new_tokens=12)[0] for p, s in zip(PROMPTS, seeds, strict=True)]
    shuffled = e.generate(PROMPTS[::-1] + PROMPTS[:2], [*seeds[::-1], 7, 8], max_new_tokens=12)
    assert full == alone  # same tokens alone and in the batch of 6 (different padding and batch size)
    assert shuffled[: len(PROMPTS)] == full[::-1]
    assert len({s.token_ids for s in full}) > 1  # the samples differ from prompt to prompt
    other_seed = e.generate(PROMPTS[:1], [seeds[0] + 1], max_new_tokens=12)[0]
    assert other_seed.token_ids != full[0].token_ids  # the seed matters


def test_one_seed_per_prompt(tok: Any) -> None:
    with pytest.raises(ValueError, match="one seed per prompt"):
        _engine(tok).generate(PROMPTS, [1])


def test_sleep_level_1_parks_the_weights_and_wakes_bit_exact(tok: Any) -> None:
    e = _engine(tok)
    ref, before = _state(e), e.generate(PROMPTS, list(range(6)))
    ptrs = [p.data_ptr() for p in e.model.parameters()]
    e.sleep(1)
    assert e.sleeping
    assert all(p.data_ptr() != q for p, q in zip(e.model.parameters(), ptrs, strict=True))  # moved to the arena
    with pytest.raises(RuntimeError, match="sleeps"):
        e.generate(PROMPTS, list(range(6)))
    e.sleep(1)  # idempotent
    e.wake()
    assert not e.sleeping and tensors_equal(e.model.state_dict(), ref)
    assert e.generate(PROMPTS, list(range(6))) == before


def test_sleep_level_2_drops_the_weights_and_refuses_to_sample_until_reloaded(tok: Any) -> None:
    e = _engine(tok)
    ref, before = _state(e), e.generate(PROMPTS, list(range(6)))
    inv_freq = [b.clone() for b in e.model.buffers()]
    e.sleep(2)
    assert all(p.numel() == 0 for p in e.model.parameters())  # nothing kept
    with pytest.raises(RuntimeError, match="wake"):
        e.load_weights(ref)
    e.wake()
    assert e.needs_weights and all(torch.isnan(p).all() for p in e.model.parameters())
    assert all(torch.equal(a, b) for a, b in zip(e.model.buffers(), inv_freq, strict=True))  # buffers kept
    with pytest.raises(RuntimeError, match="not reloaded"):
        e.generate(PROMPTS, list(range(6)))
    e.load_weights(iter(list(ref.items())))  # (name, tensor) pairs
    assert not e.needs_weights and tensors_equal(e.model.state_dict(), ref)
    assert e.generate(PROMPTS, list(range(6))) == before


def test_load_weights_refuses_unknown_names(tok: Any) -> None:
    e = _engine(tok)
    with pytest.raises(KeyError, match=r"not\.a\.weight"):
        e.load_weights({"not.a.weight": torch.zeros(1)})


def test_offloader_sleeps_on_suspend_and_wakes_and_reloads_on_resume(tok: Any) -> None:
    e = _engine(tok)
    ref = _state(e)
    engine: RolloutEngine = e  # the Transformers engine is a RolloutEngine
    with pytest.raises(ValueError, match="weights="):
        EngineOffloader(engine, level=2)
    with pytest.raises(ValueError, match="sleep level"):
        EngineOffloader(engine, level=3)
    off = EngineOffloader(engine, level=2, weights=lambda: ref)
    nbytes = e.device_bytes()
    assert off.state_bytes() == nbytes > 0
    rep = off.offload()
    assert e.sleeping and off.offloaded and rep.bytes_moved == 0  # level 2 drops, moves nothing
    assert off.state_bytes() == nbytes  # still what the engine takes back on resume
    off.restore()
    assert not e.sleeping and not e.needs_weights and tensors_equal(e.model.state_dict(), ref)
    assert (off.stats.sleeps, off.stats.wakes, off.stats.reloads) == (1, 1, 1)
    one = EngineOffloader(engine, level=1)
    assert one.offload().bytes_moved == nbytes and one.restore().bytes_moved == nbytes
    assert one.stats.reloads == 0 and tensors_equal(e.model.state_dict(), ref)


def test_a_failed_reload_leaves_the_workload_suspended_and_a_retry_reloads(tok: Any) -> None:
    e = _engine(tok)
    ref = _state(e)
    calls = []

    def weights() -> dict[str, torch.Tensor]:
        calls.append(1)
        if len(calls) == 1:
            raise OSError("the trainer's weights are not reachable yet")
        return ref

    off = EngineOffloader(e, level=2, weights=weights)
    off.offload()
    with pytest.raises(OSError, match="not reachable"):
        off.restore()  # the SDK acknowledges a failed resume; the agent may retry it
    assert e.needs_weights and off.state_bytes() == e.device_bytes()
    off.restore()
    assert not e.needs_weights and tensors_equal(e.model.state_dict(), ref)
    assert off.restore().bytes_moved == 0  # resumed: nothing more to do
    assert (off.stats.wakes, off.stats.reloads) == (2, 1)
