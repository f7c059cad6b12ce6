"""Launch: one entry of a step's launch plan, (what it computes, the call that makes it), with the weights it reads.

A plan entry unpacks as the pair it always was (`for label, run in plan`); a Launch adds what the decode profile
(profiles/decode_profile.py) needs to give each kind of launch its bytes per step and the step its floor, declared
where the launch is built, since the builder holds the weight tensors:
  reads    the weights the launch reads whole;
  experts  a mixture's expert tensors it reads in part (ExpertReads): the slices (first axis) of the experts that a
           routing buffer names, which only the step's routing says.
A plain (label, run) pair reads no weight (attention, kv_store, RoPE, sampling, ...); tests/test_launch_reads.py checks,
on the cpu backend and GPU architectures' plans stepped on the host, that every weight a launch's kernels are given is
declared.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from hipcore.model.weight_handle import Weight
from hipcore.ops.weight_formats import row_bytes
from hipcore.runtime.device import Buffer


def weight_bytes(w: Weight) -> int:
    """The bytes of `w` as stored on the device: its rows (every axis but the last) in its format."""
    return math.prod(w.shape[:-1]) * row_bytes(w.fmt, w.cols)


@dataclass(frozen=True)
class ExpertReads:
    """Expert tensors [n_expert, ...] of which a launch reads the slices of the experts named by the first `pairs`
    int32 entries of `ids` (moe_route's output: token t's j-th expert at t * k + j)."""

    weights: tuple[Weight, ...]
    ids: Buffer
    pairs: int
    n_expert: int

    def bytes_for(self, experts: int) -> int:
        """Bytes read when `experts` distinct experts are selected."""
        return sum(weight_bytes(w) for w in self.weights) * experts // self.n_expert


class Launch(tuple):
    """(label, run), unpacked as a pair, with .reads (weights read whole) and .experts (ExpertReads or None)."""

    def __new__(cls, label: str, run: Callable[[], None], reads: tuple[Weight | None, ...] = (),
                experts: ExpertReads | None = None):
        launch = super().__new__(cls, (label, run))
        launch.reads = tuple(w for w in reads if w is not None)  # optional weights (biases) come as None
        launch.experts = experts
        return launch

    @property
    def label(self) -> str:
        return self[0]

    def fixed_bytes(self) -> int:
        """The bytes of the weights it reads whole."""
        return sum(weight_bytes(w) for w in self.reads)


def declared(entry: tuple) -> Launch:
    """A plan entry as a Launch (a plain pair reads no weight)."""
    return entry if isinstance(entry, Launch) else Launch(*entry)
