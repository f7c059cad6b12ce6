"""The seam between the engine and a model: what the engine calls each step (docs/architecture.md,
"The path of a request"). ModelRunner (hipcore/model/forward.py) is the model's runner; tests and profiles
plug in smaller ones (a runner that only touches the KV cache, one that counts calls)."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np

from hipcore.gguf.config import ModelConfig
from hipcore.model.batch import StepBatch
from hipcore.ops.sample import SamplingRows


@runtime_checkable
class Runner(Protocol):
    """Executes one step's batch; the engine reads config.context_length and config.vocab_size."""

    config: ModelConfig

    def execute(self, batch: StepBatch) -> np.ndarray:
        """float32 logits [len(batch.sample_rows), vocab] on the host."""
        ...


@runtime_checkable
class SamplingRunner(Runner, Protocol):
    """A runner that also picks the tokens on the device, so only the token ids come back."""

    def execute_sampled(self, batch: StepBatch, sampling: SamplingRows) -> np.ndarray:
        """int32 token ids [len(batch.sample_rows)]."""
        ...


@runtime_checkable
class OverlappingRunner(SamplingRunner, Protocol):
    """A sampling runner whose steps can be launched without waiting for them, so that the host prepares the
    next step while the device runs this one (hipcore/engine/step_launch.py). A decode step may take its
    token ids on the device from the step before it (`follows`): then it can be launched before the host
    has read that step's tokens."""

    def launch_sampled(self, batch: StepBatch, sampling: SamplingRows, follows: object | None = None) -> object:
        """Launch the step and return a handle for collect(). follows: the handle of the decode step just
        launched, not yet collected, in which the same sequences in the same order sampled every row; row
        i's token becomes token i of `batch` (whose token_ids are then ignored)."""
        ...

    def collect(self, pending: object) -> np.ndarray:
        """Wait for a launched step; int32 token ids [len(batch.sample_rows)]. Each handle is collected once,
        in launch order."""
        ...


@runtime_checkable
class MaskDeferringRunner(OverlappingRunner, Protocol):
    """An overlapping runner whose decode step can be launched before its rows' token masks are known (a grammar's
    mask needs the token of the step before): the launches up to the logits now, the masked sampling later, so the
    host computes the masks while the device computes the logits (hipcore/engine/step_launch.py)."""

    def launch_before_masks(self, batch: StepBatch, sampling: SamplingRows, follows: object | None = None) -> object:
        """launch_sampled without the sampling, which waits for sample_under_masks; collect() after that."""
        ...

    def sample_under_masks(self, pending: object, mask: np.ndarray) -> None:
        """Launch the step's sampling under `mask` (uint32 [sample rows, mask_words(vocab)], all ones for a row
        without a grammar), before any other step."""
        ...
