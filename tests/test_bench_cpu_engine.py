"""scripts/bench/bench_cpu_engine.py's --rounds-of load (serve_bench.sh's load generator without HTTP), on the cpu backend:
every group runs its rounds, a group's next round starts only once its last one has ended, and the groups overlap."""

from __future__ import annotations

import sys
from pathlib import Path

from support.engine_testing import load_tiny, tiny_model

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts" / "bench"))
import bench_cpu_engine  # noqa: E402


def test_rounds_of_a_group_follow_each_other_and_groups_overlap(tmp_path_factory):
    # max_seqs 3: one request of the four waits, so a group's two end at different steps
    with load_tiny(tiny_model(tmp_path_factory), max_seqs=3, kv_blocks=80) as model:
        engine = model.engine
        prompts = bench_cpu_engine.bench_prompts(model.config.vocab_size, 4, 5)
        group_of = {tuple(p): i // 2 for i, p in enumerate(prompts)}  # the same prompts each round, 2 a group
        submitted: list[tuple[int, int]] = []  # (group, request id) in submission order
        most_active = 0
        original = engine.submit

        def submit(prompt, params, **kwargs):
            nonlocal most_active
            group = group_of[tuple(prompt)]
            earlier = [rid for g, rid in submitted if g == group]
            ended = [rid for rid in earlier if engine.finished_record(rid) is not None]
            # a group's round goes in whole, after every request of its rounds before has ended
            assert len(earlier) % 2 == 0 and ended == earlier or len(earlier) % 2 == 1 and len(ended) == len(earlier) - 1
            rid = original(prompt, params, **kwargs)
            submitted.append((group, rid))
            most_active = max(most_active, engine.active_count)
            return rid

        engine.submit = submit
        result = bench_cpu_engine.run_rounds(engine, model.config.vocab_size, 4, 2, 3, prompt_tokens=5, gen_tokens=6)
        assert result["requests"] == 12 and result["generated_tokens"] == 12 * 6 and result["endings"] == ["length"]
        assert [g for g, _ in submitted].count(0) == [g for g, _ in submitted].count(1) == 6
        assert most_active == 4  # both groups submitted at once, never more than the concurrency




def test_burst_window_starts_at_the_first_token_and_ends_with_the_last_request(tmp_path_factory):
    # max_seqs 2 of 3 requests: the third's prompt waits until one of the first two has ended, so the batch's
    # window (llama-benchy's: the first request's first token to the last request's end) holds an early request's
    # decoding and the late one's, one after the other
    with load_tiny(tiny_model(tmp_path_factory), max_seqs=2, kv_blocks=80) as model:
        engine = model.engine
        ids: list[int] = []
        original = engine.submit
        engine.submit = lambda *args, **kwargs: ids.append(original(*args, **kwargs)) or ids[-1]
        prompts = bench_cpu_engine.bench_prompts(model.config.vocab_size, 3, 5)
        result = bench_cpu_engine.run_once(engine, prompts, 6)
        records = [engine.finished_record(i) for i in ids]
    assert result["generated_tokens"] == 18 and result["endings"] == ["length"]
    assert abs(result["burst_tok_s"] * result["burst_window_s"] - 15) < 1e-6  # 6 - 1 tokens of each request
    assert 0 < result["burst_window_s"] <= result["wall_s"]
    spans = {r.request_id: r.seconds - r.time_to_first_token for r in records}  # each request's own decoding
    late = max(records, key=lambda r: r.time_to_first_token)
    early = min(records, key=lambda r: r.seconds)
    assert late.time_to_first_token >= early.seconds - 1e-3  # it waited for a free slot (submissions µs apart)
    assert result["burst_window_s"] >= max(spans.values())
    assert result["burst_window_s"] >= spans[early.request_id] + spans[late.request_id] - 1e-3
