"""Argument checks and launch geometry shared by the op launchers.

A launcher takes device memory as Buffers or as int addresses. A kernel cannot report a bad argument,
it reads or writes the wrong memory, so the launchers check what they can before launching: sizes
are positive and fit the kernel's int32 parameters, a Buffer is large enough for what the kernel
touches, and addresses have the alignment the kernel's vector loads need. A mistake here is a bug in
the caller, reported as a ValueError naming the op and the argument.
"""

from __future__ import annotations

from typing import Any

from hipcore.runtime.device import Buffer

INT32_MAX = 2**31 - 1
ELEMENTWISE_THREADS = 256
ELEMENTWISE_MAX_BLOCKS = 65_535  # the kernels loop over what a grid this size does not cover


def address(arg: Any) -> int:
    return arg.addr() if isinstance(arg, Buffer) else int(arg)


def check_sizes(op: str, **sizes: int) -> None:
    """Each size is an int in [1, 2^31 - 1] (the kernels take them as int32)."""
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= INT32_MAX:
            raise ValueError(f"{op}: {name} must be an int in [1, {INT32_MAX}], got {value!r}")


def check_memory(op: str, name: str, arg: Any, nbytes: int, alignment: int = 4) -> None:
    """`arg` (a Buffer or an address) holds `nbytes` bytes (checked for Buffers) at an address that
    is a multiple of `alignment`."""
    if isinstance(arg, Buffer):
        if arg.nbytes < nbytes:
            raise ValueError(f"{op}: {name} needs {nbytes} bytes, the buffer {arg.label or hex(arg.ptr)} has {arg.nbytes}")
    elif isinstance(arg, bool) or not isinstance(arg, int) or arg <= 0:
        raise ValueError(f"{op}: {name} must be a Buffer or a non-null int address, got {arg!r}")
    if address(arg) % alignment:
        raise ValueError(f"{op}: {name} at {address(arg):#x} is not {alignment}-byte aligned, as the kernel needs")


def elementwise_grid(n: int) -> tuple[int, int]:
    """(grid, block) for a grid-stride elementwise kernel over n items."""
    return min(-(-n // ELEMENTWISE_THREADS), ELEMENTWISE_MAX_BLOCKS), ELEMENTWISE_THREADS


def row_block(n: int, max_threads: int) -> int:
    """Threads for a one-block-per-row kernel: enough for n elements, a multiple of 64 (a whole number
    of warps on every vendor), at most max_threads."""
    return min(max_threads, max(64, -(-n // 64) * 64))


def check_disjoint(op: str, first: tuple[str, Any, int], second: tuple[str, Any, int]) -> None:
    """The byte ranges (name, arg, nbytes) do not overlap: for kernels whose pointers are __restrict__."""
    (name_a, a, size_a), (name_b, b, size_b) = first, second
    start_a, start_b = address(a), address(b)
    if start_a < start_b + size_b and start_b < start_a + size_a:
        raise ValueError(f"{op}: {name_a} and {name_b} overlap; the kernel needs them apart")


def check_qkv_rope(op: str, q: Any, k: Any, v: Any, x: Any, positions: Any, *, q_rows: int, kv_rows: int,
                   cols: int, n_tokens: int, head_dim: int, rope_dim: int) -> None:
    """The outputs and head geometry of a fused q|k|v product with RoPE (fused_matvec, fused_matmul, fused_qmatvec).
    rope_dim 0 rotates nothing: a later launch does (head_norm_rope, after the per-head norms)."""
    check_sizes(op, head_dim=head_dim, kv_rows=kv_rows)
    if isinstance(rope_dim, bool) or not isinstance(rope_dim, int) or rope_dim < 0 or head_dim % 2 or rope_dim % 2 \
            or rope_dim > head_dim or q_rows % head_dim or kv_rows % head_dim:
        raise ValueError(f"{op}: q_rows {q_rows} and kv_rows {kv_rows} must be whole heads of an even head_dim "
                         f"{head_dim}, rope_dim {rope_dim} even, at most head_dim and not negative")
    for name, out, width in (("q", q, q_rows), ("k", k, kv_rows), ("v", v, kv_rows)):
        check_memory(op, name, out, n_tokens * width * 4)
        check_disjoint(op, (name, out, n_tokens * width * 4), ("x", x, n_tokens * cols * 4))
    check_memory(op, "positions", positions, n_tokens * 4)
