"""Counting the handles a device has handed out that the ledger does not hold: streams, events,
graphs and modules. leak-check reads the counts after the warm-up and at the end (growth is a leak
the byte ledger cannot see: a stream per step costs the driver a handle and a little memory).

Objects are held weakly: one that was collected is gone (its finalizer released the driver handle
on the GPU backends), and one that was destroyed explicitly no longer counts either.
"""

from __future__ import annotations

import weakref

HANDLE_KINDS = ("streams", "events", "graphs", "modules")


class LiveHandles:
    """Handle objects by kind, weakly held; `counts()` skips the ones marked `destroyed`."""

    def __init__(self) -> None:
        self._live: dict[str, weakref.WeakSet] = {kind: weakref.WeakSet() for kind in HANDLE_KINDS}

    def add(self, kind: str, obj: object) -> None:
        if kind not in self._live:
            raise ValueError(f"unknown handle kind {kind!r}; expected one of {', '.join(HANDLE_KINDS)}")
        self._live[kind].add(obj)

    def counts(self) -> dict[str, int]:
        return {kind: sum(1 for obj in list(objs) if not getattr(obj, "destroyed", False))
                for kind, objs in self._live.items()}
