"""DecodeGraphs: one captured graph per batch-size bucket, replayed for decode-only steps.

A decode step of n sequences is padded to the smallest bucket >= n (1, 2, 4, ... 128, up to the
runner's capacity) and replays that bucket's graph: ~180 launches become one, and the host does not
spend ~5 us of Python per launch. A bucket's graph is captured the first time it is needed, right
after that step ran eagerly (so every kernel is loaded and the launch sequence is known to work),
and kept until close(). Graphs read everything that changes per step from the runner's fixed
buffers (StepInputs), so they stay valid for the model's lifetime; they own no device memory of
their own beyond what the driver keeps for an instantiated graph.

With capture off, decode steps are still padded to their bucket and run the same launches eagerly:
that is the eager twin a replay must equal bit for bit.
"""

from __future__ import annotations

from typing import Callable

from hipcore.runtime.device import Device, Graph, Stream

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128)


def bucket_capacity(max_seqs: int) -> int:
    """The largest bucket a runner for max_seqs sequences pads to (its buffers must hold that many rows)."""
    return next((b for b in BUCKETS if b >= max_seqs), BUCKETS[-1])


def capture_launches(device: Device, stream: Stream, launches: Callable[[], None]) -> Graph:
    """The launches captured on `stream` (not run) into an instantiated graph."""
    with device.capture(stream) as cap:
        launches()
    assert cap.graph is not None
    return cap.graph


class DecodeGraphs:
    def __init__(self, device: Device, stream: Stream, max_seqs: int, *, capture: bool = True):
        self.device, self.stream, self.capture = device, stream, capture
        top = bucket_capacity(max_seqs)
        self.buckets = tuple(b for b in BUCKETS if b <= top)
        self._graphs: dict[int, Graph] = {}
        self.captures = 0
        self.replays = 0

    def bucket_for(self, n: int) -> int | None:
        """The bucket a decode step of n sequences pads to, or None (run it eagerly)."""
        return next((b for b in self.buckets if b >= n), None)

    def captured(self, bucket: int) -> bool:
        return bucket in self._graphs

    def run(self, bucket: int, launches: Callable[[], None]) -> None:
        """Replay the bucket's graph, or run `launches` eagerly and capture them for next time."""
        if not self.capture:
            launches()
            return
        graph = self._graphs.get(bucket)
        if graph is not None:
            graph.launch(self.stream)
            self.replays += 1
            return
        launches()
        self._graphs[bucket] = capture_launches(self.device, self.stream, launches)
        self.captures += 1

    def close(self) -> None:
        """Destroy every graph; idempotent."""
        graphs, self._graphs = self._graphs, {}
        for graph in graphs.values():
            graph.destroy()
