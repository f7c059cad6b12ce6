"""Bugs planted on purpose, to prove that the leak check can fail. For rocmforge's own tests only.

Each bug is the kind that the tools this project replaces shipped (DESIGN "The path of the data"):
KV blocks kept after a normal completion, released only on cancel, a "free" that keeps the device
buffer alive, finished records never dropped, a reference count decremented twice, a device
buffer allocated per step and never freed (which compute-sanitizer must catch too, on NVIDIA),
host memory kept per request (10 KiB, and 300 bytes), a block counted as held twice and
released once, which hangs a run that does not judge progress by tokens kept, device memory
taken through the raw driver call (outside the ledger), and a stream, a kernel module (loaded
outside the kernel cache) or a file descriptor made per few steps and never released (handles the
ledger does not hold). And three of a prefix cache (hipcore/kvcache/prefix_cache.py), where memory
accounting gets subtle: a cached block taken with a reference nobody drops, an eviction that leaves
the block's hash entry pointing at it once it is free, and a block taken from the cache but left on
its LRU, so that an eviction frees it while a sequence still holds it.

Why monkeypatching one loaded model instead of hook points in the engine, cache or loader: the
production code keeps no test-only branches that a configuration could ever reach, and each bug
is planted at the exact method where the real one lived. Every patch is applied to the instances
of one LoadedModel (never to a class), and only when ROCMFORGE_TESTING=1 is set; the CLI option
that asks for it (`--plant-bug`) is hidden from --help. A patch that no longer finds the method it
replaces raises, so a refactor cannot silently turn a planted-bug test into a test of nothing.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from typing import Callable

from hipcore.errors import UsageError
from hipcore.engine.request import Ending

TESTING_ENV = "ROCMFORGE_TESTING"
DEVICE_LEAK_BYTES = 256 << 10
DEVICE_LEAK_EVERY = 4  # steps
HOST_LEAK_BYTES = 10 << 10  # per request: the least the host check must catch over 200 requests
HOST_LEAK_SLOW_BYTES = 300  # per request: the least it must catch over 3,000
DRIVER_LEAK_BYTES = 4 << 20  # two granules of the driver's figure: seen after one allocation
DRIVER_LEAK_EVERY = 8  # steps
HANDLE_LEAK_EVERY = 8  # steps, for the stream and file-descriptor leaks
PINNING_LEAVES_FREE = 2  # blocks the refcount-taken-twice bug leaves free


@dataclass(frozen=True)
class PlantedBug:
    name: str
    description: str
    plant: Callable[[object], None]  # takes a hipcore.engine.loader.LoadedModel


def check_allowed(name: str) -> None:
    if os.environ.get(TESTING_ENV) != "1":
        raise UsageError(f"--plant-bug is for rocmforge's own tests; it needs {TESTING_ENV}=1 in the environment")
    if name not in BUGS:
        raise UsageError(f"unknown planted bug {name!r}; known: {', '.join(BUGS)}")


def plant(name: str, loaded) -> None:
    check_allowed(name)
    BUGS[name].plant(loaded)


def _require(obj: object, attr: str) -> None:
    if not hasattr(obj, attr):
        raise RuntimeError(f"planted bug: {type(obj).__name__}.{attr} no longer exists; update profiles/leak_bugs.py")


def _release_only_for(endings: frozenset[Ending]) -> Callable[[object], None]:
    """Engine._release_sequence that forgets to give the blocks back unless the ending is one of these."""

    def plant_it(loaded) -> None:
        engine = loaded.engine
        _require(engine, "_release_sequence")
        original = engine._release_sequence

        def release_sequence(seq, ending):
            if ending in endings:
                original(seq, ending)
            else:  # the bug: the sequence is marked done, its blocks stay in the cache
                seq.finished = True
                seq.ending = seq.ending or ending

        engine._release_sequence = release_sequence

    return plant_it


def _free_keeps_buffer(loaded) -> None:
    """Buffer.free() of the KV pools marks them freed but never returns the memory (to the driver
    or the ledger): what the earlier implementation's close did."""
    device = loaded.device
    _require(device, "_release")
    original = device._release

    def release(buf):
        if buf.tag != "kv":
            original(buf)

    device._release = release


def _finished_records_kept(loaded) -> None:
    engine = loaded.engine
    _require(engine, "finished_bound")
    engine.finished_bound = sys.maxsize


def _double_decrement(loaded) -> None:
    """BlockPool.release drops a shared block's reference count by two instead of one."""
    pool = getattr(loaded.cache, "_pool", None)
    if pool is None:
        raise RuntimeError("planted bug: KvCache._pool no longer exists; update profiles/leak_bugs.py")
    _require(pool, "release")
    original = pool.release

    def release(block, seq_id, fence):
        if pool.refcount(block) > 1:
            original(block, seq_id, fence)
        return original(block, seq_id, fence)

    pool.release = release


def _refcount_taken_twice(loaded) -> None:
    """BlockPool.take takes a second reference on a block handed out alone while the pool still has
    room (as a prefix cache that pins blocks when it can afford to would), and nothing ever drops
    it: the block's one table releases it once, so it never comes back. The pool shrinks to
    PINNING_LEAVES_FREE blocks, enough to admit a longer request's prompt but not to let it grow:
    the request preempts itself and recomputes its prompt forever, a leak that hangs the run."""
    pool = getattr(loaded.cache, "_pool", None)
    if pool is None:
        raise RuntimeError("planted bug: KvCache._pool no longer exists; update profiles/leak_bugs.py")
    _require(pool, "take")
    original = pool.take

    def take(count, seq_id):
        taken = original(count, seq_id)
        if taken is not None and count == 1 and pool.num_free >= PINNING_LEAVES_FREE:
            pool.share(taken[0], seq_id)  # the bug: a second reference nobody will release
        return taken

    pool.take = take


def _global_pool(loaded):
    pool = getattr(loaded.cache, "_pool", None)
    if pool is None:
        raise RuntimeError("planted bug: KvCache._pool no longer exists; update profiles/leak_bugs.py")
    if loaded.cache.prefix is None:
        raise RuntimeError("planted bug: this bug lives in the prefix cache; run with prefix caching on")
    return pool


def _cached_reference_kept(loaded) -> None:
    """BlockPool.take_cached takes a second reference on a block it takes off the LRU of cached blocks, and
    nothing ever drops it: the block's tables release it once, so it is neither cached nor free again."""
    pool = _global_pool(loaded)
    _require(pool, "take_cached")
    original = pool.take_cached

    def take_cached(block, seq_id):
        was_cached = block in pool.prefix.lru
        original(block, seq_id)
        if was_cached:
            pool.share(block, seq_id)  # the bug: a reference nobody will release

    pool.take_cached = take_cached


def _hash_entry_on_freed_block(loaded) -> None:
    """An eviction takes the block off the LRU and frees it but forgets its hash entry (PrefixIndex.forget drops
    only the LRU entry): the index points at a free block, which the next prompt with that prefix may be handed
    while another sequence fills it."""
    pool = _global_pool(loaded)
    index = pool.prefix
    _require(index, "forget")

    def forget(block):
        index.lru.pop(block, None)  # the bug: block_of and entry_of keep the block

    index.forget = forget


def _eviction_of_a_held_block(loaded) -> None:
    """BlockPool.take_cached leaves the block it takes on the LRU of cached blocks: an eviction then frees it while
    the sequence that took it still holds it (the eviction skips no referenced block)."""
    pool = _global_pool(loaded)
    _require(pool, "take_cached")
    original = pool.take_cached

    def take_cached(block, seq_id):
        was_cached = block in pool.prefix.lru
        original(block, seq_id)
        if was_cached:
            pool.prefix.lru[block] = None  # the bug: still evictable while held

    pool.take_cached = take_cached


def _host_leak(nbytes: int) -> Callable[[object], None]:
    """Engine._end_request keeps `nbytes` of host memory per request ended (a per-request cache or
    log that is never trimmed)."""

    def plant_it(loaded) -> None:
        engine = loaded.engine
        _require(engine, "_end_request")
        original = engine._end_request
        kept: list[bytearray] = []

        def end_request(request, ending, error=None):
            kept.append(bytearray(nbytes))  # the bug: never dropped
            return original(request, ending, error)

        engine._end_request = end_request

    return plant_it


def _every_steps(every: int, make: Callable[[object], object]) -> Callable[[object], None]:
    """Every `every` engine steps, make(loaded) makes something that is kept and never released.
    Planted around Engine.step (not a runner method) so that it survives changes to how the runner
    is called."""

    def plant_it(loaded) -> None:
        engine = loaded.engine
        _require(engine, "step")
        original = engine.step
        calls = [0]
        kept: list = []  # holds the objects, never their release: a real leak

        def step(*args, **kwargs):  # whatever Engine.step takes goes through: the plant changes no call
            events = original(*args, **kwargs)
            calls[0] += 1
            if calls[0] % every == 0:
                kept.append(make(loaded))
            return events

        engine.step = step

    return plant_it


def _scratch_buffer(loaded) -> object:
    return loaded.device.allocate(DEVICE_LEAK_BYTES, tag="scratch", label="planted.step_scratch")


def _raw_device_memory(loaded) -> int:
    """Device memory straight from the driver call (Device._raw_alloc), which the ledger never sees."""
    _require(loaded.device, "_raw_alloc")
    return loaded.device._raw_alloc(DRIVER_LEAK_BYTES)


def _stream(loaded) -> object:
    return loaded.device.create_stream()


def _uncached_module(loaded) -> object:
    """add's code loaded again, past the kernel cache: a launcher that loads its module itself."""
    from hipcore.runtime import kernels

    _require(kernels, "_load_module")
    return kernels._load_module(loaded.device, "add")


def _open_file(loaded) -> object:
    return open(os.devnull, "rb")


_NATURAL = frozenset({Ending.EOS, Ending.STOP, Ending.LENGTH})
_ALL = frozenset(Ending)

BUGS: dict[str, PlantedBug] = {b.name: b for b in (
    PlantedBug("no-release-on-completion", "KV blocks are not released when a request completes normally",
               _release_only_for(_ALL - _NATURAL)),
    PlantedBug("release-on-cancel-only", "KV blocks are released only when a request is cancelled",
               _release_only_for(frozenset({Ending.CANCELLED}))),
    PlantedBug("free-keeps-buffer", "freeing the KV pools keeps their device memory alive", _free_keeps_buffer),
    PlantedBug("finished-records-kept", "finished-request records are never dropped", _finished_records_kept),
    PlantedBug("double-decrement", "a shared KV block's reference count is decremented twice", _double_decrement),
    PlantedBug("refcount-taken-twice", "a KV block handed out alone is counted as held twice and released once",
               _refcount_taken_twice),
    PlantedBug("cached-reference-kept", "a block taken from the prefix cache gets a reference nobody drops",
               _cached_reference_kept),
    PlantedBug("hash-entry-on-freed-block", "an eviction frees a cached block but leaves its hash entry pointing at it",
               _hash_entry_on_freed_block),
    PlantedBug("eviction-of-held-block", "a block taken from the prefix cache stays evictable, and an eviction frees it "
               "while a sequence holds it", _eviction_of_a_held_block),
    PlantedBug("host-leak", f"{HOST_LEAK_BYTES >> 10} KiB of host memory kept per request ended", _host_leak(HOST_LEAK_BYTES)),
    PlantedBug("host-leak-slow", f"{HOST_LEAK_SLOW_BYTES} bytes of host memory kept per request ended",
               _host_leak(HOST_LEAK_SLOW_BYTES)),
    PlantedBug("device-leak", f"a {DEVICE_LEAK_BYTES >> 10} KiB device buffer allocated every {DEVICE_LEAK_EVERY} "
               "steps is never freed", _every_steps(DEVICE_LEAK_EVERY, _scratch_buffer)),
    PlantedBug("driver-leak", f"{DRIVER_LEAK_BYTES >> 20} MiB of device memory allocated through the raw driver call "
               f"(outside the ledger) every {DRIVER_LEAK_EVERY} steps and never freed",
               _every_steps(DRIVER_LEAK_EVERY, _raw_device_memory)),
    PlantedBug("stream-leak", f"a stream created every {HANDLE_LEAK_EVERY} steps is never destroyed",
               _every_steps(HANDLE_LEAK_EVERY, _stream)),
    PlantedBug("module-leak", f"a kernel module loaded every {HANDLE_LEAK_EVERY} steps outside the kernel cache "
               "is never unloaded", _every_steps(HANDLE_LEAK_EVERY, _uncached_module)),
    PlantedBug("fd-leak", f"a file opened every {HANDLE_LEAK_EVERY} steps is never closed",
               _every_steps(HANDLE_LEAK_EVERY, _open_file)),
)}
