"""The child process a chat template renders in (started by hipcore.tokenizer.chat_template).

Why a process: the in-process limits of chat_template_sandbox see every line the template runs
and every operation known to allocate, but a single C-level operation on a crafted value (an
exponentially shared nested list compared or printed) runs without returning to Python. A child
with an address-space and CPU-time limit, killed by the parent at the deadline, bounds those too.

Protocol: one JSON object on stdin {template, context, timeout_s, max_chars}; one JSON object on
stdout, {"text": ...} or {"kind": "usage"|"invalid", "message": ...}. ASCII-only JSON both ways.
"""

from __future__ import annotations

import json
import math
import sys

from hipcore.tokenizer.chat_template_sandbox import describe_failure, render_sandboxed

ADDRESS_SPACE_LIMIT = 1 << 30  # bytes of virtual memory for the whole child


def main() -> None:
    request = json.loads(sys.stdin.read())
    _limit_resources(float(request["timeout_s"]))
    try:
        text = render_sandboxed(request["template"], request["context"], timeout_s=float(request["timeout_s"]),
                                max_chars=int(request["max_chars"]))
        reply = {"text": text}
    except Exception as exc:  # every failure of an untrusted template becomes a reply
        kind, message = describe_failure(exc)
        reply = {"kind": kind, "message": message}
    sys.stdout.write(json.dumps(reply, ensure_ascii=True))
    sys.stdout.flush()


def _limit_resources(timeout_s: float) -> None:
    try:
        import resource
    except ImportError:  # pragma: no cover - Windows: the parent's kill at the deadline remains
        return
    _lower(resource, resource.RLIMIT_AS, ADDRESS_SPACE_LIMIT)
    _lower(resource, resource.RLIMIT_CPU, math.ceil(timeout_s) + 1)


def _lower(resource, which: int, value: int) -> None:  # type: ignore[no-untyped-def]
    soft, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    if soft == resource.RLIM_INFINITY or value < soft:
        try:
            resource.setrlimit(which, (value, hard))
        except (ValueError, OSError):
            pass  # a platform that refuses (macOS and RLIMIT_AS): the other limits remain


if __name__ == "__main__":
    main()
