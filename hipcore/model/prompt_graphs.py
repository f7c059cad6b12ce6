"""PromptGraphs: captured graphs of small prompt and mixed steps, one per padded shape, kept with their launch plans.

A step that evaluates prompt tokens (a prompt, or prompt tokens joining decoding sequences) ran its ~180-240
launches eagerly, and in a server every decoding sequence waits through it: on an NVIDIA H200 the demo model's
31-token prompt step took 3.4-4.9 ms eagerly and 2.0-2.1 ms replayed from a graph
(docs/history/2026-11-29-first-token-prompt-graphs.md). Steps of up
to PROMPT_GRAPH_MAX_TOKENS tokens are therefore padded to a few shapes (padded_shape: tokens to a multiple of
TOKEN_QUANTUM, logits rows to a decode bucket), so that shapes recur, and a shape's graph is captured the third
time it runs and replayed from the fourth: capturing costs a second pass over the launches and an instantiation,
paid back only by a shape that keeps coming (one seen once or twice while the cache turns over may never come
again). Padding rows compute nothing that is kept (hipcore/model/step_inputs.py: slot -1, position -1).

Graphs live exactly as long as their shape's launch plan in the runner's bounded cache of prompt-step plans
(forward.PROMPT_PLAN_CACHE_SIZE): a plan dropped from it drops its graph, so the graphs are bounded too.
"""

from __future__ import annotations

from typing import Callable, Hashable

from hipcore.model.decode_graphs import BUCKETS, capture_launches
from hipcore.runtime.device import Device, Graph, Stream

PROMPT_GRAPH_MAX_TOKENS = 128  # larger steps run eagerly at their own shape: their launches are a small share
TOKEN_QUANTUM = 16  # padded token rows: at most 15 more, a shape per 16 tokens
CAPTURE_AT_RUN = 3  # a shape's graph is captured at its third run (its plan kept all along)


def padded_shape(tokens: int, rows: int, token_capacity: int, row_capacity: int) -> tuple[int, int] | None:
    """(token rows, logits rows) a prompt or mixed step of `tokens` tokens sampling `rows` rows is padded to, or
    None where it runs at its own shape (past PROMPT_GRAPH_MAX_TOKENS, or no padded shape fits the buffers)."""
    if tokens > PROMPT_GRAPH_MAX_TOKENS:
        return None
    padded_tokens = -(-tokens // TOKEN_QUANTUM) * TOKEN_QUANTUM
    padded_rows = 0 if rows == 0 else next((b for b in BUCKETS if b >= rows), None)
    if padded_tokens > token_capacity or padded_rows is None or padded_rows > row_capacity:
        return None
    return padded_tokens, padded_rows


def padded_shapes(token_capacity: int, row_capacity: int) -> list[tuple[int, int]]:
    """Every (token rows, logits rows) padded_shape can give for these buffers, largest steps first."""
    tokens = range(TOKEN_QUANTUM, min(PROMPT_GRAPH_MAX_TOKENS, token_capacity) + 1, TOKEN_QUANTUM)
    rows = [0] + [b for b in BUCKETS if b <= row_capacity]
    return [(t, r) for t in reversed(tokens) for r in reversed(rows) if r // 2 < t]  # a bucket some r <= t pads to


class PromptGraphs:
    def __init__(self, device: Device, stream: Stream, *, capture: bool = True):
        self.device, self.stream, self.capture = device, stream, capture
        self._graphs: dict[Hashable, Graph] = {}
        self._runs: dict[Hashable, int] = {}  # eager runs of shapes without a graph (those whose plan is kept)
        self.captures = 0
        self.replays = 0

    def __len__(self) -> int:
        return len(self._graphs)

    def run(self, key: Hashable, launches: Callable[[], None]) -> None:
        """Replay the shape's graph; else run `launches` eagerly and, at the shape's CAPTURE_AT_RUN-th run, capture
        them."""
        graph = self._graphs.get(key)
        if graph is not None:
            graph.launch(self.stream)
            self.replays += 1
            return
        launches()
        runs = self._runs[key] = self._runs.get(key, 0) + 1
        if self.capture and runs >= CAPTURE_AT_RUN:
            self._graphs[key] = capture_launches(self.device, self.stream, launches)
            del self._runs[key]
            self.captures += 1

    def drop(self, key: Hashable) -> None:
        """Forget the shape: destroy its graph, if it has one (its plan left the runner's cache)."""
        self._runs.pop(key, None)
        graph = self._graphs.pop(key, None)
        if graph is not None:
            graph.destroy()

    def close(self) -> None:
        """Destroy every graph; idempotent."""
        graphs, self._graphs = self._graphs, {}
        self._runs.clear()
        for graph in graphs.values():
            graph.destroy()
