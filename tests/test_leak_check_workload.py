"""The leak check's workload and thresholds: seeded plans, the mix, the small default pool, --fail-on."""

from __future__ import annotations

from collections import Counter

import pytest

from hipcore.errors import UsageError
from hipcore.engine.scheduler import blocks_for
from profiles.leak_thresholds import Thresholds, parse_fail_on, parse_size
from profiles.leak_workload import MIX, STOP_CANDIDATES, Plan, Workload, WorkloadShape

SHAPE = WorkloadShape(seed=7, max_tokens=12, prompt_min=4, prompt_max=32, step_tokens=32, block_size=16, parallel=8)
VOCAB = 49152


def workload(shape: WorkloadShape = SHAPE, usable: int | None = None, **kw) -> Workload:
    usable = shape.default_kv_blocks() if usable is None else usable
    return Workload(shape, VOCAB, usable, max_context=4096, **kw)


def test_a_plan_depends_on_seed_and_index_only():
    a, b = workload(), workload()
    for i in (0, 1, 17, 999):
        pa, pb = a.plan(i), b.plan(i)
        assert (pa.kind, pa.prompt, pa.params, pa.trigger) == (pb.kind, pb.prompt, pb.params, pb.trigger)
    other = workload(WorkloadShape(**{**SHAPE.__dict__, "seed": 8}))
    assert [a.plan(i).prompt for i in range(20)] != [other.plan(i).prompt for i in range(20)]


def test_the_mix_covers_every_plan_in_its_proportions():
    w = workload()
    kinds = Counter(w.plan(i).kind for i in range(2000))
    assert set(kinds) == set(Plan)
    total = sum(MIX.values())
    for kind, share in MIX.items():
        expected = 2000 * share / total
        assert abs(kinds[kind] - expected) < 4 * expected ** 0.5 + 3, (kind, kinds[kind], expected)


def test_each_plan_is_shaped_for_the_ending_it_aims_at():
    w = workload(text_prompts=((1, 2, 3),), chat_prompts=((9, 8, 7, 6),))
    pool_tokens = w.usable_blocks * SHAPE.block_size
    for i in range(1500):
        p = w.plan(i)
        assert all(0 <= t < VOCAB for t in p.prompt) and p.prompt
        assert 1 <= p.params.max_tokens <= SHAPE.max_tokens
        if p.kind == Plan.CANCEL_PROMPT:  # evaluated over at least two steps
            assert SHAPE.step_tokens < len(p.prompt) <= 2 * SHAPE.step_tokens
        elif p.kind == Plan.STOP:
            assert set(p.params.stop) <= set(STOP_CANDIDATES) and len(p.params.stop) == 3
        elif p.kind == Plan.EOS:
            assert p.prompt == [9, 8, 7, 6] and p.params.temperature == 0
        elif p.kind in (Plan.CANCEL_DECODE, Plan.PARALLEL_CANCEL):
            assert 1 <= p.trigger < p.params.max_tokens - 1
        elif p.kind == Plan.CANCEL_FINAL:
            assert p.trigger == p.params.max_tokens - 1 >= 2
        elif p.kind in (Plan.FAIL_SAMPLING, Plan.FAIL_STEP):
            assert 0 <= p.trigger < p.params.max_tokens
        elif p.kind in (Plan.PARALLEL, Plan.PARALLEL_CANCEL):
            assert 2 <= p.params.n <= 3
        if p.kind == Plan.REJECT:  # can never fit: more samples than blocks
            assert p.params.n > w.usable_blocks and p.slots == 1
        else:
            assert len(p.prompt) + p.params.max_tokens <= pool_tokens


def test_the_default_pool_is_small_but_fits_every_planned_request():
    w = workload()
    usable = SHAPE.default_kv_blocks()
    largest = 0
    for i in range(3000):
        p = w.plan(i)
        if p.kind == Plan.REJECT:
            continue
        bs, n, prompt = SHAPE.block_size, p.params.n, len(p.prompt)
        shared = prompt // bs if n > 1 else 0
        largest = max(largest, shared + n * (blocks_for(prompt + p.params.max_tokens, bs) - shared))
    assert largest <= SHAPE.largest_request_blocks() and largest + 2 <= usable
    typical_demand = SHAPE.parallel * blocks_for(18 + 6, SHAPE.block_size)
    assert usable < typical_demand  # less than what `parallel` typical requests hold: preemption happens


def test_parallel_samples_never_exceed_the_sequence_slots():
    w = workload(WorkloadShape(**{**SHAPE.__dict__, "parallel": 2}))
    samples = {w.plan(i).params.n for i in range(800) if w.plan(i).kind != Plan.REJECT}
    assert max(samples) == 2


def test_a_pool_too_big_for_rejection_by_samples_uses_a_prompt_longer_than_the_pool():
    w = Workload(SHAPE, VOCAB, usable_blocks=2000, max_context=100_000)
    rejects = [w.plan(i) for i in range(600) if w.plan(i).kind == Plan.REJECT]
    assert rejects and all(len(p.prompt) == 2000 * 16 + 1 and p.params.n == 1 for p in rejects)
    small_context = Workload(SHAPE, VOCAB, usable_blocks=2000, max_context=4096)  # cannot reject: plans run instead
    assert all(small_context.plan(i).kind != Plan.REJECT for i in range(600))


def test_bad_shapes_are_usage_errors():
    for bad in ({"max_tokens": 0}, {"prompt_min": 0}, {"prompt_min": 9, "prompt_max": 8}, {"step_tokens": 1}):
        with pytest.raises(UsageError):
            Workload(WorkloadShape(**{**SHAPE.__dict__, **bad}), VOCAB, usable_blocks=10, max_context=4096)


# ---- --fail-on ----------------------------------------------------------------------------------


def test_fail_on_defaults_and_overrides():
    # The driver and the handles fail the run by default (issue 11): memory or handles outside the ledger.
    assert parse_fail_on(None) == Thresholds(blocks=0, ledger=0, driver=0, host_growth_per_1000=1 << 20, unexpected=None,
                                             handles=0)
    t = parse_fail_on(["driver=off", "host-growth=2MiB/1000req", "ledger=4KiB,blocks=off", "unexpected=3", "handles=2"])
    assert t == Thresholds(blocks=None, ledger=4096, driver=None, host_growth_per_1000=2 << 20, unexpected=3, handles=2)
    assert parse_fail_on(["host-growth=512KiB/100req"]).host_growth_per_1000 == 5 << 20
    assert parse_fail_on(["host-growth=3MiB"]).host_growth_per_1000 == 3 << 20
    assert parse_fail_on(["host-growth=off"]).host_growth_per_1000 is None
    assert parse_fail_on(None).host_traced_per_1000 == 128 << 10
    assert parse_fail_on(["host-traced=64KiB/1000req"]).host_traced_per_1000 == 64 << 10
    assert parse_fail_on(["host-traced=off"]).host_traced_per_1000 is None
    assert (parse_size("0", "x"), parse_size("1.5MiB", "x"), parse_size("2MB", "x"), parse_size("7", "x")) == (0, 1572864, 2_000_000, 7)


@pytest.mark.parametrize("spec", ["ledger", "bogus=1", "ledger=12 parsecs", "blocks=1.5", "host-growth=1MiB/0req", "driver=",
                                  "handles=1.5"])
def test_bad_fail_on_specs_are_usage_errors(spec):
    with pytest.raises(UsageError):
        parse_fail_on([spec])


def test_the_printed_command_carries_every_setting_back():
    import shlex

    from profiles.leak_settings import LeakCheckSettings

    thresholds = parse_fail_on(["host-growth=3MiB/1000req", "driver=4MiB", "blocks=off", "unexpected=2", "handles=off"])
    settings = LeakCheckSettings(model="m y.gguf", device="cpu", requests=77, parallel=3, seed=5, kv_blocks=9,
                                 max_tokens=6, prompt_tokens=(2, 9), step_tokens=12, phases=2, warmup=1,
                                 finished_bound=30, kv_dtype="q8_0", block_size=8, tracemalloc=False, thresholds=thresholds)
    words = shlex.split(settings.command_line())
    assert words[:2] == ["rocmforge", "leak-check"] and words[words.index("--model") + 1] == "m y.gguf"
    value = {words[i]: words[i + 1] for i in range(2, len(words) - 1) if words[i].startswith("--") and not words[i + 1].startswith("--")}
    assert (value["--requests"], value["--parallel"], value["--seed"], value["--kv-blocks"], value["--max-tokens"]) == ("77", "3", "5", "9", "6")
    assert (value["--prompt-tokens"], value["--step-tokens"], value["--phases"], value["--warmup"]) == ("2-9", "12", "2", "1")
    assert (value["--finished-bound"], value["--kv-dtype"], value["--block-size"]) == ("30", "q8_0", "8")
    assert "--no-tracemalloc" in words
    fail_on = [words[i + 1] for i, w in enumerate(words) if w == "--fail-on"]
    assert parse_fail_on(fail_on) == thresholds
