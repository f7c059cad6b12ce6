"""Weight: one tensor on the device, in the format its kernels read (hipcore/model/weights.py uploads them)."""

from __future__ import annotations

from dataclasses import dataclass

from hipcore.runtime.device import Buffer


@dataclass(frozen=True)
class Weight:
    buffer: Buffer
    fmt: str  # "f32", "q4_1", ...: which kernel variant reads it
    shape: tuple[int, ...]  # numpy order: (rows, cols) for matrices
    offset: int = 0  # bytes into `buffer` (matrices sharing one buffer, see FUSED_GROUPS)
    # Every value within f16's range: false only for a BF16 or MXFP4 expert tensor found wider on a matrix-core
    # device (hipcore/model/weights.py), which the matrix-core expert products (ops/moe_experts_mma.py) then leave alone.
    fits_f16: bool = True

    @property
    def rows(self) -> int:
        return self.shape[0]

    @property
    def cols(self) -> int:
        return self.shape[-1]

    def addr(self) -> int:
        """Device address of the first byte of this tensor."""
        return self.buffer.addr(self.offset)
