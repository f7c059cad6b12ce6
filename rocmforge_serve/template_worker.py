"""A long-lived child process that renders chat templates for the server, one request at a time
(started by rocmforge_serve.template_pool; not a module to import elsewhere).

hipcore.tokenizer.chat_template renders each conversation in a fresh child (chat_template_worker), which
costs ~0.1 s of CPU and of latency per request: a server at thousands of tokens/s would start dozens of
Python interpreters a second. This child keeps the same limits across renders instead:
  - address space: 1 GiB for the whole process (chat_template_worker.ADDRESS_SPACE_LIMIT);
  - CPU time: before each render the soft RLIMIT_CPU is moved to the CPU used so far + the render's
    deadline + 1 s, so each render gets the one-shot child's allowance (SIGXCPU ends the process past it);
  - the deadline: the parent kills the process when a reply is late, and starts a fresh one;
  - the in-process sandbox limits (time, output size, memory growth) as in every render.
Renders share nothing a template can change: the environment is immutable and the context is built anew.

Protocol: one ASCII JSON object a line on stdin {template, context, timeout_s, max_chars}; one line on
stdout per request, {"text": ...} or {"kind": "usage"|"invalid", "message": ...}.
"""

from __future__ import annotations

import json
import math
import sys

from hipcore.tokenizer.chat_template_sandbox import describe_failure, render_sandboxed
from hipcore.tokenizer.chat_template_worker import ADDRESS_SPACE_LIMIT


def main() -> None:
    import resource

    _set_soft(resource, resource.RLIMIT_AS, ADDRESS_SPACE_LIMIT)
    for line in sys.stdin:
        request = json.loads(line)
        timeout_s = float(request["timeout_s"])
        usage = resource.getrusage(resource.RUSAGE_SELF)
        _set_soft(resource, resource.RLIMIT_CPU, math.ceil(usage.ru_utime + usage.ru_stime + timeout_s) + 1, raise_ok=True)
        try:
            text = render_sandboxed(request["template"], request["context"], timeout_s=timeout_s,
                                    max_chars=int(request["max_chars"]))
            reply = {"text": text}
        except Exception as exc:  # every failure of an untrusted template becomes a reply
            kind, message = describe_failure(exc)
            reply = {"kind": kind, "message": message}
        sys.stdout.write(json.dumps(reply, ensure_ascii=True) + "\n")
        sys.stdout.flush()


def _set_soft(resource, which: int, value: int, *, raise_ok: bool = False) -> None:  # type: ignore[no-untyped-def]
    """Lower the soft limit to value (or move it up to value when raise_ok), never past the hard limit."""
    soft, hard = resource.getrlimit(which)
    if hard != resource.RLIM_INFINITY:
        value = min(value, hard)
    if raise_ok or soft == resource.RLIM_INFINITY or value < soft:
        try:
            resource.setrlimit(which, (value, hard))
        except (ValueError, OSError):
            pass  # a platform that refuses (macOS and RLIMIT_AS): the other limits remain


if __name__ == "__main__":
    main()
