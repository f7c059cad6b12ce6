"""SentencePiece-style encoding ("llama" vocabularies): score-driven merging with byte fallback.

Spaces become "▁" (U+2581); the text starts as one symbol per character; the adjacent pair whose
concatenation is a token with the highest score is merged (leftmost on equal scores) until no
pair forms a token. A leftover symbol that is not a token is spelled with byte tokens <0xNN>.
This is the algorithm of llama.cpp's SPM tokenizer, so the ids agree with it.
"""

from __future__ import annotations

import heapq
from typing import Mapping, Sequence

SPACE_MARK = "\u2581"


class SpmEncoder:
    def __init__(self, token_to_id: Mapping[str, int], scores: Sequence[float], unk_id: int | None):
        self._token_to_id = token_to_id
        self._scores = scores
        self._unk_id = unk_id
        self._byte_ids: list[int | None] = [self._byte_token(b) for b in range(256)]

    def _byte_token(self, b: int) -> int | None:
        found = self._token_to_id.get(f"<0x{b:02X}>")
        if found is None and b < 0x80:
            found = self._token_to_id.get(chr(b))  # some vocabularies spell ASCII bytes plainly
        return found

    def encode(self, text: str, out: list[int]) -> None:
        """Append the ids of `text` (spaces already escaped by the caller) to `out`."""
        token_to_id = self._token_to_id
        for piece in self._merge(text):
            found = token_to_id.get(piece)
            if found is not None:
                out.append(found)
                continue
            for b in piece.encode("utf-8"):
                byte_id = self._byte_ids[b]
                if byte_id is None:
                    # No byte fallback in this vocabulary: SentencePiece's answer is <unk>.
                    if self._unk_id is not None:
                        out.append(self._unk_id)
                    break
                out.append(byte_id)

    def _merge(self, text: str) -> list[str]:
        symbols = list(text)
        n = len(symbols)
        if n < 2:
            return symbols
        token_to_id = self._token_to_id
        scores = self._scores
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        # Entries: (-score, left, right, merged length); highest score first, then leftmost.
        heap: list[tuple[float, int, int, int]] = []

        def push(left: int, right: int) -> None:
            merged = symbols[left] + symbols[right]
            found = token_to_id.get(merged)
            if found is not None:
                score = scores[found] if scores else 0.0
                heapq.heappush(heap, (-score, left, right, len(merged)))

        for i in range(n - 1):
            push(i, i + 1)
        while heap:
            _, left, right, size = heapq.heappop(heap)
            left_text, right_text = symbols[left], symbols[right]
            # A stale pair: a side was merged away or grew since it was queued.
            if not left_text or not right_text or len(left_text) + len(right_text) != size:
                continue
            symbols[left] = left_text + right_text
            symbols[right] = ""
            after = nxt[right]
            nxt[left] = after
            if after >= 0:
                prev[after] = left
            if prev[left] >= 0:
                push(prev[left], left)
            if after >= 0:
                push(left, after)
        return [s for s in symbols if s]
