"""The engine driven from several threads: one owner thread steps while others submit, cancel and
stream; every request is accounted for and the cache ends quiescent."""

from __future__ import annotations

import queue
import random
import threading

import pytest

from support.engine_testing import assert_quiescent, greedy, kv_bytes, load_tiny, prompt_of, tiny_model

from hipcore.engine.engine import EngineHooks
from hipcore.engine.request import CancelResult, Ending

THREADS = 4
OPERATIONS_PER_THREAD = 60  # 240 submit / cancel / stream operations in all


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return tiny_model(tmp_path_factory)


def test_submit_cancel_and_stream_from_threads_while_one_thread_steps(path):
    with load_tiny(path, max_seqs=8, max_step_tokens=48, block_size=4, kv_blocks=40, finished_bound=10_000) as model:
        engine = model.engine
        baseline = kv_bytes(model)
        submitted: list[int] = []
        cancels: dict[int, list[CancelResult]] = {}
        streamed: dict[int, tuple[int, ...]] = {}
        cancelled_at_once: set[int] = set()
        lock = threading.Lock()
        stop = threading.Event()
        errors: list[BaseException] = []
        steps = [0]

        def owner() -> None:
            try:
                while not (stop.is_set() and not engine.has_work()):
                    if engine.has_work():
                        engine.step()
                        model.cache.check_invariants()  # the owner may inspect the cache between steps
                        steps[0] += 1
                    else:
                        stop.wait(0.001)
            except BaseException as exc:  # surfaced by the main thread
                errors.append(exc)

        def client(seed: int) -> None:
            rng = random.Random(seed)
            try:
                for _ in range(OPERATIONS_PER_THREAD):
                    roll = rng.random()
                    if roll < 0.1:  # submit and cancel at once: it must end cancelled (100 steps to go)
                        rid = engine.submit(prompt_of(rng.randint(1, 20)), greedy(100))
                        result = engine.cancel(rid)
                        with lock:
                            submitted.append(rid)
                            cancels.setdefault(rid, []).append(result)
                            cancelled_at_once.add(rid)
                    elif roll < 0.5:
                        rid = engine.submit(prompt_of(rng.randint(1, 20), salt=rng.randrange(1000)), greedy(rng.randint(1, 4)))
                        with lock:
                            submitted.append(rid)
                    elif roll < 0.85:
                        with lock:
                            rid = rng.choice(submitted) if submitted and rng.random() < 0.9 else 10**9 + rng.randrange(100)
                        result = engine.cancel(rid)
                        with lock:
                            cancels.setdefault(rid, []).append(result)
                    else:  # submit one and read its stream to the end, as a server's handler would
                        rid = engine.submit(prompt_of(rng.randint(1, 12)), greedy(3))
                        request = engine.request(rid)
                        with lock:
                            submitted.append(rid)
                        tokens: list[int] = []
                        while True:
                            event = request.events.get(timeout=60)
                            tokens += event.token_ids
                            if event.finished:
                                break
                        with lock:
                            streamed[rid] = tuple(tokens)
            except BaseException as exc:
                errors.append(exc)

        owner_thread = threading.Thread(target=owner)
        owner_thread.start()
        clients = [threading.Thread(target=client, args=(seed,)) for seed in range(THREADS)]
        for t in clients:
            t.start()
        for t in clients:
            t.join(timeout=300)
        stop.set()
        owner_thread.join(timeout=300)
        assert not errors, errors
        assert not owner_thread.is_alive() and not any(t.is_alive() for t in clients)

        assert len(submitted) == len(set(submitted)) > 100
        assert steps[0] > 0
        endings = {}
        for rid in submitted:
            record = engine.finished_record(rid)
            assert record is not None, f"request {rid} was never ended"
            endings[rid] = record.ending
            assert record.ending in (Ending.LENGTH, Ending.EOS, Ending.CANCELLED)
            if record.ending == Ending.CANCELLED:
                assert CancelResult.CANCELLED in cancels.get(rid, [])
            if rid in cancelled_at_once:
                assert record.ending == Ending.CANCELLED
            if rid in streamed:
                assert streamed[rid] == record.generated_tokens[0]
        for rid, results in cancels.items():
            if rid >= 10**9:
                assert set(results) == {CancelResult.UNKNOWN}
        assert sum(engine.stats.endings.values()) == len(submitted)
        assert cancelled_at_once and Ending.LENGTH in endings.values()
        assert_quiescent(model, baseline)


def test_a_second_thread_cannot_step_at_the_same_time(path):
    """A step() from another thread while one is under way (entered from the engine's mid-step hook)
    is refused, not interleaved."""
    with load_tiny(path, kv_blocks=16) as model:
        engine = model.engine
        baseline = kv_bytes(model)
        seen: queue.Queue = queue.Queue()

        def step_from_another_thread(requests) -> bool:
            def other():
                try:
                    engine.step()
                    seen.put(None)
                except RuntimeError as exc:
                    seen.put(exc)
            t = threading.Thread(target=other)
            t.start()
            t.join()
            return False

        engine.hooks = EngineHooks(fail_step=step_from_another_thread)
        engine.submit(prompt_of(4), greedy(1))
        engine.step()
        engine.hooks = EngineHooks()
        error = seen.get_nowait()
        assert isinstance(error, RuntimeError) and "one thread owns the engine" in str(error)
        engine.run_until_idle()
        assert_quiescent(model, baseline)
