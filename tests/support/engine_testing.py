"""Helpers shared by the engine, scheduler, paged-model and generate tests (not a test module).

    path = tiny_model(tmp_path_factory)              # a tiny llama GGUF, head_dim 32 (q8_0 works)
    with load_tiny(path, kv_blocks=40) as model:     # the real loader, on the cpu backend
        tokens = solo_greedy(model, prompt, max_tokens=8)
        assert_quiescent(model, kv_bytes)
"""

from __future__ import annotations

import collections
from pathlib import Path

from support.gguf_factory import write_tiny_llama

from hipcore.engine.loader import LoadedModel, LoadOptions, load_model
from hipcore.engine.request import Ending
from hipcore.engine.sampler import SamplingParams

# hidden 128 over 4 query heads = head_dim 32, so every KV dtype (q8_0 stores 32-element blocks) can
# hold it; 2 KV heads make attention grouped-query, as in the demo model.
TINY_SHAPE = dict(n_layers=2, hidden=128, n_heads=4, n_kv_heads=2, ffn=192, vocab=384, context=256)
TINY_EOS = 2  # tokenizer.ggml.eos_token_id of gguf_factory's gpt2 vocabulary


def tiny_model(tmp_path_factory, name: str = "tiny.gguf", **overrides) -> Path:
    """Write (once per name per test run) the tiny test model and return its path."""
    folder = tmp_path_factory.getbasetemp() / "engine-models"
    folder.mkdir(exist_ok=True)
    path = folder / name
    if not path.exists():
        write_tiny_llama(path, **{**TINY_SHAPE, "tensor_type": "F32", "seed": 7, **overrides})
    return path


def load_tiny(path: Path, **options) -> LoadedModel:
    """load_model on the cpu backend; options are LoadOptions fields (max_seqs, kv_blocks, ...)."""
    defaults = dict(device="cpu", max_seqs=8, max_step_tokens=64, block_size=16, kv_dtype="f32")
    return load_model(str(path), LoadOptions(**{**defaults, **options}))


def greedy(max_tokens: int, **kwargs) -> SamplingParams:
    return SamplingParams(temperature=0.0, max_tokens=max_tokens, **kwargs)


def prompt_of(length: int, salt: int = 0, vocab: int = TINY_SHAPE["vocab"]) -> list[int]:
    """A deterministic prompt of `length` token ids that avoids the special ids 0..2."""
    return [3 + (salt * 131 + i * 37 + (i * i) % 11) % (vocab - 3) for i in range(length)]


def run_alone(model: LoadedModel, prompt, params: SamplingParams):
    """Submit one request, step until it ends, return its FinishedRecord."""
    rid = model.engine.submit(prompt, params)
    model.engine.run_until_idle()
    record = model.engine.finished_record(rid)
    assert record is not None, f"request {rid} did not end"
    return record


def solo_greedy(model: LoadedModel, prompt, max_tokens: int) -> tuple[int, ...]:
    record = run_alone(model, prompt, greedy(max_tokens))
    assert record.ending in (Ending.LENGTH, Ending.EOS), record
    return record.generated_tokens[0]


def kv_bytes(model: LoadedModel) -> int:
    return model.device.ledger.bytes_by_tag()["kv"]


def assert_quiescent(model: LoadedModel, kv_bytes_before: int) -> None:
    """KV cache invariant 6 (docs/architecture.md): no per-request state, every block back and every count 0, the
    ledger's kv bytes unchanged."""
    cache = model.cache
    cache.check_invariants(quiescent=True)
    assert cache.num_free_blocks == cache.num_usable_blocks
    assert all(cache.refcount(b) == 0 for b in range(1, cache.config.num_blocks))  # block 0: the null block
    assert kv_bytes(model) == kv_bytes_before == cache.config.cache_bytes
    assert model.engine.active_count == 0
    assert not model.engine.scheduler.running and not model.engine.scheduler.waiting
    assert not model.engine.has_work()


def count_releases(model: LoadedModel) -> collections.Counter:
    """Count the KV cache's free_sequence calls per sequence id from now on (the release path's
    only way to give blocks back), so a test can say "released exactly once"."""
    releases: collections.Counter[int] = collections.Counter()
    free_sequence = model.cache.free_sequence

    def counting_free(seq_id: int, **kwargs) -> None:
        releases[seq_id] += 1
        free_sequence(seq_id, **kwargs)

    model.cache.free_sequence = counting_free
    return releases


def drain_events(request) -> list:
    events = []
    while not request.events.empty():
        events.append(request.events.get_nowait())
    return events
