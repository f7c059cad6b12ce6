"""Mutation fuzz of the GGUF reader: 30,000 files derived from two valid seeds, parsed in memory.

Mutations: bit flips, bytes set to boundary values, truncation, insertion and deletion, splices of
header bytes, and integer fields (counts, lengths, dims, types, offsets, scalar values: the
positions the raw builder recorded) set to boundary, huge, negative-as-unsigned and nearby values.
Most land in the header, where the parser works; the tensor data itself is never interpreted.

Pass criteria (issue 2): no exception other than GGUFError, no parse over 2 s, and every accepted
file's tensors lie inside its data section, aligned, without overlap, with sizes the types imply.
Seeded, so a failure names a reproducible case index.
"""

from __future__ import annotations

import random
import signal
import time
from collections import Counter

import pytest

from support.gguf_factory import raw_tiny_llama
from hipcore.gguf import quants
from hipcore.gguf.file import GGUFError, ModelPlan, read_plan, read_plan_from_bytes

N_FILES = 30_000
FUZZ_SEED = 20_261_122
TIME_LIMIT_S = 2.0
DISK_CHECK_EVERY = 250  # also parse some of them from disk: the mmap path must agree with the bytes path

SEEDS = (
    dict(n_layers=1, hidden=32, n_heads=2, n_kv_heads=1, ffn=32, vocab=300, tokenizer="gpt2"),
    dict(n_layers=1, hidden=32, n_heads=2, n_kv_heads=1, ffn=32, vocab=310, tokenizer="llama", tied=False,
         alignment=64, tensor_type="Q8_0"),
)
BOUNDARY_BYTES = (0x00, 0xFF, 0x7F, 0x80, 0x01, 0xFE, 0x20, 0x3F)
INTERESTING = (0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 31, 32, 33, 63, 64, 255, 256, 1 << 15, (1 << 16) - 1, 1 << 16,
               (1 << 31) - 1, 1 << 31, (1 << 32) - 1, 1 << 32, (1 << 32) + 1, 1 << 48, 1 << 62, (1 << 63) - 1,
               1 << 63, (1 << 64) - 64, (1 << 64) - 32, (1 << 64) - 1)


class ParseTimeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise ParseTimeout()


class Mutator:
    def __init__(self, data: bytes, fields: list[tuple[str, int, int]], header_end: int, rng: random.Random):
        self.data, self.fields, self.header_end, self.rng = data, fields, header_end, rng

    def position(self, buf: bytearray) -> int:
        limit = self.header_end if self.rng.random() < 0.9 else len(buf)
        return self.rng.randrange(max(1, min(limit, len(buf))))

    def mutate(self) -> tuple[bytes, list[str]]:
        buf = bytearray(self.data)
        ops = []
        for _ in range(self.rng.choice((1, 1, 1, 2, 2, 3, 4))):
            op = self.rng.choice(("flip", "byte", "field", "field", "field", "truncate", "insert", "delete", "splice"))
            ops.append(getattr(self, "_" + op)(buf))
            if not buf:
                break
        return bytes(buf), ops

    def _flip(self, buf: bytearray) -> str:
        pos, bit = self.position(buf), self.rng.randrange(8)
        if pos < len(buf):
            buf[pos] ^= 1 << bit
        return f"flip {pos}:{bit}"

    def _byte(self, buf: bytearray) -> str:
        pos = self.position(buf)
        value = self.rng.choice(BOUNDARY_BYTES + (self.rng.randrange(256),))
        if pos < len(buf):
            buf[pos] = value
        return f"byte {pos}={value:#x}"

    def _field(self, buf: bytearray) -> str:
        label, pos, width = self.rng.choice(self.fields)
        if pos + width > len(buf):
            return f"field {label} (gone)"
        current = int.from_bytes(buf[pos:pos + width], "little")
        choice = self.rng.random()
        if choice < 0.5:
            value = self.rng.choice(INTERESTING)
        elif choice < 0.8:
            value = current + self.rng.choice((-64, -32, -8, -2, -1, 1, 2, 8, 32, 64))
        elif choice < 0.9:
            value = current * self.rng.choice((2, 4, 1 << 16)) or 1
        else:
            value = self.rng.getrandbits(8 * width)
        value &= (1 << (8 * width)) - 1
        buf[pos:pos + width] = value.to_bytes(width, "little")
        return f"field {label}={value}"

    def _truncate(self, buf: bytearray) -> str:
        keep = self.rng.randrange(len(buf)) if self.rng.random() < 0.5 else self.position(buf)
        del buf[keep:]
        return f"truncate {keep}"

    def _insert(self, buf: bytearray) -> str:
        pos, n = self.position(buf), self.rng.randint(1, 16)
        chunk = bytes(self.rng.choice(BOUNDARY_BYTES + (self.rng.randrange(256),)) for _ in range(n))
        buf[pos:pos] = chunk
        return f"insert {pos}+{n}"

    def _delete(self, buf: bytearray) -> str:
        pos, n = self.position(buf), self.rng.randint(1, 16)
        del buf[pos:pos + n]
        return f"delete {pos}-{n}"

    def _splice(self, buf: bytearray) -> str:
        src, dst, n = self.position(buf), self.position(buf), self.rng.randint(1, 24)
        buf[dst:dst + n] = buf[src:src + n]
        return f"splice {src}->{dst}+{n}"


def check_accepted(plan: ModelPlan, size: int) -> list[str]:
    """What must hold for any file the reader accepts; returns the violations."""
    problems = []
    if plan.file_size != size:
        problems.append(f"file_size {plan.file_size} != {size}")
    previous_end = plan.data_offset
    for t in sorted(plan.tensors, key=lambda t: t.offset):
        block, block_bytes = quants.block_geometry(t.ggml_type)
        n = 1
        for d in t.dims:
            n *= d
        if t.offset < previous_end:
            problems.append(f"{t.name} at {t.offset} overlaps data before {previous_end} (or the header)")
        if t.offset + t.nbytes > size:
            problems.append(f"{t.name} ends at {t.offset + t.nbytes}, past the file end {size}")
        if (t.offset - plan.data_offset) % plan.alignment:
            problems.append(f"{t.name} offset {t.offset} misaligned")
        if n != t.n_elements or t.nbytes != n // block * block_bytes or t.dims[0] % block:
            problems.append(f"{t.name} size {t.nbytes} disagrees with dims {t.dims} of {t.type_name}")
        previous_end = t.offset + t.nbytes
    expected = plan.config.expected_tensor_shapes()
    for name, shape in expected.items():
        if plan.tensor(name).shape != shape:
            problems.append(f"{name} shape {plan.tensor(name).shape} != config {shape}")
    if plan.total_tensor_bytes != sum(t.nbytes for t in plan.tensors):
        problems.append("total_tensor_bytes is not the sum of the tensors")
    return problems


def test_mutation_fuzz(tmp_path):
    rng = random.Random(FUZZ_SEED)
    mutators = []
    for kwargs in SEEDS:
        raw = raw_tiny_llama(**kwargs)
        data = raw.to_bytes()
        plan = read_plan_from_bytes(data)
        assert not check_accepted(plan, len(data))  # the seeds themselves are valid
        mutators.append(Mutator(data, list(raw.fields), plan.data_offset, rng))

    crashes, hangs, bad_accepts, not_one_line = [], [], [], []
    outcomes: Counter = Counter()
    error_fields: Counter = Counter()
    slowest = 0.0
    previous = signal.signal(signal.SIGALRM, _on_alarm)
    started = time.perf_counter()
    try:
        for index in range(N_FILES):
            data, ops = mutators[index % len(mutators)].mutate()
            start = time.perf_counter()
            signal.setitimer(signal.ITIMER_REAL, TIME_LIMIT_S)
            try:
                plan = read_plan_from_bytes(data, name=f"fuzz-{index}")
                outcome = "accepted"
            except GGUFError as exc:
                plan, outcome = None, f"exit {exc.exit_code}"
                error_fields[exc.field.split(" ")[0].split("[")[0]] += 1
                message = str(exc)
                if "\n" in message or not message.isprintable() or exc.exit_code not in (3, 4):
                    not_one_line.append((index, ops, message))
            except ParseTimeout:
                hangs.append((index, ops))
                continue
            except Exception as exc:  # the point of the fuzz: anything else is a crash
                crashes.append((index, ops, f"{type(exc).__name__}: {exc}"))
                continue
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            elapsed = time.perf_counter() - start
            slowest = max(slowest, elapsed)
            if elapsed > TIME_LIMIT_S:
                hangs.append((index, ops))
            outcomes[outcome] += 1
            if plan is not None:
                problems = check_accepted(plan, len(data))
                if problems:
                    bad_accepts.append((index, ops, problems))
            if index % DISK_CHECK_EVERY == 0:
                _same_result_from_disk(tmp_path / f"fuzz-{index}.gguf", data, plan)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    total = time.perf_counter() - started

    print(f"\nfuzz: {N_FILES} files in {total:.1f} s, slowest parse {slowest * 1000:.1f} ms; outcomes {dict(outcomes)}")
    print(f"fuzz: {len(error_fields)} distinct error fields, most common {error_fields.most_common(8)}")
    assert crashes == [], crashes[:5]
    assert hangs == [], hangs[:5]
    assert bad_accepts == [], bad_accepts[:5]
    assert not_one_line == [], not_one_line[:5]
    # The fuzz must really exercise the reader: most files rejected, for many different reasons,
    # both exit codes seen, and some mutations (e.g. inside strings) harmless enough to be accepted.
    assert outcomes["exit 3"] > N_FILES // 2
    assert outcomes["exit 4"] > 0 and outcomes["accepted"] > 0
    assert len(error_fields) >= 25, error_fields


def _same_result_from_disk(path, data: bytes, plan_from_bytes: ModelPlan | None) -> None:
    path.write_bytes(data)
    try:
        plan = read_plan(path)
    except GGUFError as exc:
        assert plan_from_bytes is None, f"{path.name}: bytes accepted, disk rejected: {exc}"
        return
    assert plan_from_bytes is not None, f"{path.name}: disk accepted what bytes rejected"
    assert plan.tensors == plan_from_bytes.tensors and plan.config == plan_from_bytes.config


@pytest.mark.parametrize("kwargs", SEEDS, ids=("gpt2", "llama-q8"))
def test_every_truncation_of_a_seed_is_rejected(kwargs):
    """Exhaustive over the header: any prefix shorter than the whole file is an error, never a crash."""
    data = raw_tiny_llama(**kwargs).to_bytes()
    plan = read_plan_from_bytes(data)
    data_end = plan.tensors[-1].offset + plan.tensors[-1].nbytes  # what follows is only padding
    for cut in list(range(0, plan.data_offset + 64)) + [data_end - 1]:
        with pytest.raises(GGUFError):
            read_plan_from_bytes(data[:cut])
