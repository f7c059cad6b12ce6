"""StepSamplingRows: the SamplingRows of the engine's consecutive device-sampled steps.

The rows of a step are its samplers' parameters (temperature, top_k, top_p, min_p) and one uniform each.
Decode steps of the same running requests have the same samplers in the same order, step after step: their
parameter columns are kept and only the uniforms are drawn (none at all when every row is greedy), instead
of converting every sampler's parameters to numpy every step. Samplers are compared by identity (a list
comparison, one pointer test each); the kept columns are read-only, since consecutive steps share them.
"""

from __future__ import annotations

import numpy as np

from hipcore.engine.sampler import Sampler
from hipcore.ops.sample import SamplingRows


class StepSamplingRows:
    def __init__(self) -> None:
        self.clear()

    def rows(self, samplers: list[Sampler]) -> SamplingRows:
        """The rows of one step, one per sampler in order; draws each non-greedy sampler's next uniform."""
        if samplers != self._samplers:
            built = SamplingRows.from_rows([sampler.device_row + (0.0,) for sampler in samplers])
            self._columns = (built.temperature, built.top_k, built.top_p, built.min_p)
            self._no_draws = None if any(not sampler.greedy for sampler in samplers) else built.uniform
            for array in (*self._columns, built.uniform):
                array.flags.writeable = False
            self._samplers = samplers
        uniform = self._no_draws
        if uniform is None:
            uniform = np.array([0.0 if sampler.greedy else sampler.next_uniform() for sampler in samplers],
                               dtype=np.float64)
        return SamplingRows(*self._columns, uniform)

    def clear(self) -> None:
        """Forget the samplers (of requests that may have ended)."""
        self._samplers: list[Sampler] | None = None  # None: no step yet (an empty step builds its empty columns)
        self._columns: tuple[np.ndarray, ...] = ()
        self._no_draws: np.ndarray | None = None  # the uniforms when every row is greedy (zeros), else None
