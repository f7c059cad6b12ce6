"""Sampler filters on hand-made distributions, seeded reproducibility, penalties, stops."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hipcore.errors import EXIT_USAGE, UsageError
from hipcore.engine.sampler import (
    Sampler,
    SamplingParams,
    StopChecker,
    StopReason,
    apply_penalties,
    min_p_filter,
    top_k_filter,
    top_p_filter,
)


def logits_for(probs) -> np.ndarray:
    return np.log(np.asarray(probs, dtype=np.float64)).astype(np.float32)


def draw_many(params: SamplingParams, logits: np.ndarray, n: int, history=()) -> np.ndarray:
    sampler = Sampler(params)
    return np.array([sampler.sample(logits, history) for _ in range(n)])


def only_filter(**kwargs) -> SamplingParams:
    """All filters off except those named: isolates one filter's effect."""
    base = dict(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=1234)
    base.update(kwargs)
    return SamplingParams(**base)


# --- greedy ---------------------------------------------------------------------------------------

def test_greedy_is_argmax_on_random_logits():
    rng = np.random.default_rng(0)
    sampler = Sampler(SamplingParams(temperature=0.0))
    for _ in range(50):
        logits = rng.normal(size=1000).astype(np.float32)
        assert sampler.sample(logits) == int(np.argmax(logits))


def test_greedy_ignores_top_k_p_and_seed():
    logits = np.array([0.1, 3.0, 2.9, -1.0], dtype=np.float32)
    for seed in (1, 2, 3):
        params = SamplingParams(temperature=0.0, top_k=1, top_p=0.1, min_p=0.9, seed=seed)
        assert Sampler(params).sample(logits) == 1


# --- each filter on a hand-made distribution -------------------------------------------------------

def test_top_k_keeps_the_k_largest_sorted():
    logits = np.array([0.5, 4.0, -2.0, 3.0, 1.0], dtype=np.float32)
    ids, kept = top_k_filter(np.arange(5), logits, 3)
    assert ids.tolist() == [1, 3, 4]
    assert kept.tolist() == [4.0, 3.0, 1.0]
    ids, _ = top_k_filter(np.arange(5), logits, 0)
    assert ids.tolist() == [1, 3, 4, 0, 2]


def test_top_p_keeps_the_shortest_prefix_reaching_p():
    probs = [0.40, 0.25, 0.15, 0.10, 0.05, 0.03, 0.02]
    ids, logits = top_k_filter(np.arange(7), logits_for(probs), 0)
    kept, _ = top_p_filter(ids, logits, 0.79)
    assert kept.tolist() == [0, 1, 2]          # 0.40 + 0.25 + 0.15 = 0.80 >= 0.79
    kept, _ = top_p_filter(ids, logits, 0.81)
    assert kept.tolist() == [0, 1, 2, 3]
    kept, _ = top_p_filter(ids, logits, 0.01)
    assert kept.tolist() == [0]                # never empty
    kept, _ = top_p_filter(ids, logits, 1.0)
    assert len(kept) == 7


def test_min_p_keeps_tokens_above_a_fraction_of_the_best():
    probs = [0.50, 0.30, 0.10, 0.06, 0.04]
    ids = np.arange(5)
    kept, _ = min_p_filter(ids, logits_for(probs), 0.15)   # threshold 0.075
    assert kept.tolist() == [0, 1, 2]
    kept, _ = min_p_filter(ids, logits_for(probs), 0.0)
    assert kept.tolist() == [0, 1, 2, 3, 4]
    kept, _ = min_p_filter(ids, logits_for(probs), 1.0)
    assert kept.tolist() == [0]


def test_sampling_never_leaves_the_filtered_set():
    probs = [0.30, 0.25, 0.20, 0.15, 0.10]
    logits = logits_for(probs)
    assert set(draw_many(only_filter(top_k=2), logits, 400).tolist()) == {0, 1}
    assert set(draw_many(only_filter(top_p=0.5), logits, 400).tolist()) == {0, 1}
    assert set(draw_many(only_filter(min_p=0.6), logits, 400).tolist()) == {0, 1, 2}


def test_unfiltered_draws_follow_the_distribution():
    probs = np.array([0.5, 0.3, 0.15, 0.05])
    draws = draw_many(only_filter(), logits_for(probs), 8000)
    freq = np.bincount(draws, minlength=4) / draws.size
    # 4 standard deviations of a binomial proportion at n=8000: about 0.022 at p=0.5.
    assert np.all(np.abs(freq - probs) < 4 * np.sqrt(probs * (1 - probs) / draws.size))


def test_the_whole_vocabulary_is_drawn_in_id_order_without_a_sort():
    # No top-k, no top-p: the draw walks the tokens in id order (as the device kernel does, with no sort),
    # so a uniform u picks the first id whose running probability exceeds u. Ascending logits make the
    # sorted order the reverse of the id order: a sorted walk would pick other tokens for the same draws.
    logits = np.log(np.arange(1, 9, dtype=np.float64)).astype(np.float32)
    for min_p, kept in ((0.0, 8), (0.5, 5)):  # min-p 0.5 keeps ids 3..7 (logit >= log(8) + log(0.5))
        params = only_filter(min_p=min_p, seed=99)
        sampler, twin = Sampler(params), Sampler(params)
        for _ in range(40):
            u = twin.next_uniform()
            weights = np.where(np.arange(8) >= 8 - kept, np.arange(1, 9), 0).astype(np.float64)
            running = np.cumsum(weights) / weights.sum()
            assert sampler.sample(logits) == int(np.searchsorted(running, u, side="right"))


def test_temperature_sharpens_and_flattens():
    logits = logits_for([0.6, 0.3, 0.1])
    cold = draw_many(only_filter(temperature=0.25), logits, 3000)
    hot = draw_many(only_filter(temperature=4.0), logits, 3000)
    # Exact expectations: p_i ~ p_i^(1/T).
    cold_expected = np.array([0.6, 0.3, 0.1]) ** 4 / np.sum(np.array([0.6, 0.3, 0.1]) ** 4)
    hot_expected = np.array([0.6, 0.3, 0.1]) ** 0.25 / np.sum(np.array([0.6, 0.3, 0.1]) ** 0.25)
    assert abs(np.mean(cold == 0) - cold_expected[0]) < 0.03
    assert abs(np.mean(hot == 2) - hot_expected[2]) < 0.03


def test_top_p_sees_probabilities_before_temperature():
    # llama.cpp order: top-p runs at temperature 1, so a high temperature cannot widen the set.
    logits = logits_for([0.7, 0.2, 0.1])
    draws = draw_many(only_filter(top_p=0.85, temperature=50.0), logits, 500)
    assert set(draws.tolist()) == {0, 1}


# --- reproducibility ------------------------------------------------------------------------------

def test_same_seed_same_tokens_other_seed_other_tokens():
    logits = np.random.default_rng(7).normal(size=500).astype(np.float32)
    params = SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=42)
    first = draw_many(params, logits, 64)
    again = draw_many(params, logits, 64)
    other = draw_many(SamplingParams(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=43), logits, 64)
    assert first.tolist() == again.tolist()
    assert first.tolist() != other.tolist()


def test_no_seed_picks_one_and_reports_it():
    sampler = Sampler(SamplingParams(temperature=1.0))
    assert 0 <= sampler.seed < 1 << 64
    logits = np.random.default_rng(3).normal(size=300).astype(np.float32)
    replay = Sampler(SamplingParams(temperature=1.0, seed=sampler.seed))
    assert [sampler.sample(logits) for _ in range(20)] == [replay.sample(logits) for _ in range(20)]


# --- penalties ------------------------------------------------------------------------------------

def test_repeat_penalty_lowers_positive_and_negative_logits():
    logits = np.array([2.0, -2.0, 1.0, 0.5], dtype=np.float32)
    params = SamplingParams(repeat_penalty=2.0, repeat_last_n=64)
    out = apply_penalties(logits, [0, 1, 1], params)
    assert out.tolist() == [1.0, -4.0, 1.0, 0.5]
    assert logits.tolist() == [2.0, -2.0, 1.0, 0.5]      # input untouched


def test_penalty_window_only_sees_the_last_n_tokens():
    logits = np.array([2.0, 2.0, 2.0], dtype=np.float32)
    params = SamplingParams(repeat_penalty=2.0, repeat_last_n=2)
    out = apply_penalties(logits, [0, 1, 2], params)
    assert out.tolist() == [2.0, 1.0, 1.0]
    whole = apply_penalties(logits, [0, 1, 2], SamplingParams(repeat_penalty=2.0, repeat_last_n=-1))
    assert whole.tolist() == [1.0, 1.0, 1.0]
    off = apply_penalties(logits, [0, 1, 2], SamplingParams(repeat_penalty=2.0, repeat_last_n=0))
    assert off.tolist() == [2.0, 2.0, 2.0]


def test_frequency_and_presence_penalties_count_occurrences():
    logits = np.zeros(3, dtype=np.float32)
    params = SamplingParams(frequency_penalty=0.5, presence_penalty=0.25)
    out = apply_penalties(logits, [0, 0, 0, 1], params)
    assert out.tolist() == pytest.approx([-1.75, -0.75, 0.0])


def test_greedy_applies_penalties_first():
    logits = np.array([3.0, 2.0, 0.0], dtype=np.float32)
    sampler = Sampler(SamplingParams(temperature=0.0, repeat_penalty=2.0))
    assert sampler.sample(logits, history=[7, 8]) == 0
    assert sampler.sample(logits, history=[0]) == 1        # 3.0 / 2 < 2.0


# --- validation -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, word", [
    (dict(temperature=-0.1), "temperature"),
    (dict(temperature=math.nan), "temperature"),
    (dict(top_k=-1), "top_k"),
    (dict(top_k=2.5), "top_k"),
    (dict(top_p=0.0), "top_p"),
    (dict(top_p=1.5), "top_p"),
    (dict(min_p=-0.1), "min_p"),
    (dict(repeat_penalty=0.0), "repeat_penalty"),
    (dict(repeat_last_n=-2), "repeat_last_n"),
    (dict(presence_penalty=3.0), "presence_penalty"),
    (dict(frequency_penalty=math.inf), "frequency_penalty"),
    (dict(seed=-1), "seed"),
    (dict(max_tokens=0), "max_tokens"),
    (dict(stop=("",)), "stop"),
    (dict(stop=("x",) * 17), "stop"),
    (dict(temperature=True), "temperature"),
])
def test_bad_values_are_usage_errors_with_one_line(kwargs, word):
    with pytest.raises(UsageError) as info:
        SamplingParams(**kwargs)
    message = str(info.value)
    assert word in message and "\n" not in message
    assert info.value.exit_code == EXIT_USAGE


def test_a_single_stop_string_is_accepted_as_text():
    assert SamplingParams(stop="###").stop == ("###",)


# --- stops ----------------------------------------------------------------------------------------

def feed(checker: StopChecker, pieces):
    shown = []
    for token_id, text in pieces:
        shown.append(checker.push(token_id, text))
        if checker.finished:
            break
    return shown


def test_stop_string_spanning_tokens_is_never_shown():
    checker = StopChecker(eos_ids=[0], stop_strings=["</end>"], max_tokens=100)
    shown = feed(checker, [(5, "Hello <"), (6, "/e"), (7, "nd"), (8, "> tail"), (9, "more")])
    assert "".join(shown) == "Hello "
    assert shown[0] == "Hello "                # '<' held back as soon as it could start the stop
    assert checker.reason is StopReason.STOP_STRING
    assert checker.output == "Hello "


def test_false_start_of_a_stop_string_is_released():
    checker = StopChecker(eos_ids=[0], stop_strings=["</end>"], max_tokens=100)
    shown = feed(checker, [(5, "a </e"), (6, "x> b")])
    assert shown == ["a ", "</ex> b"]
    assert not checker.finished


def test_stop_string_inside_one_token_cuts_the_rest():
    checker = StopChecker(eos_ids=[], stop_strings=["STOP", "\n\n"], max_tokens=100)
    shown = feed(checker, [(1, "one\n\ntwo STOP three")])
    assert shown == ["one"]
    assert checker.reason is StopReason.STOP_STRING


def test_eos_releases_held_text_and_hides_itself():
    checker = StopChecker(eos_ids=[2, 3], stop_strings=["##"], max_tokens=100)
    shown = feed(checker, [(5, "x #"), (3, "<|im_end|>")])
    assert shown == ["x ", "#"]
    assert checker.reason is StopReason.EOS


def test_max_tokens_stops_and_releases_everything():
    checker = StopChecker(eos_ids=[0], stop_strings=["zz"], max_tokens=3)
    shown = feed(checker, [(5, "a"), (6, "b"), (7, "cz"), (8, "z")])
    assert "".join(shown) == "abcz"
    assert checker.reason is StopReason.MAX_TOKENS
    assert checker.tokens_seen == 3


def test_stop_string_completed_by_the_last_allowed_token_wins_over_max_tokens():
    checker = StopChecker(eos_ids=[], stop_strings=["zz"], max_tokens=2)
    shown = feed(checker, [(5, "az"), (6, "z")])
    assert "".join(shown) == "a"
    assert checker.reason is StopReason.STOP_STRING


def test_flush_and_push_after_finish():
    checker = StopChecker(eos_ids=[], stop_strings=["abc"], max_tokens=10)
    assert checker.push(1, "xab") == "x"
    assert checker.flush() == "ab"
    checker = StopChecker(eos_ids=[0], max_tokens=1)
    checker.push(4, "y")
    with pytest.raises(UsageError):
        checker.push(4, "y")
