"""Chat templates: the model's own Jinja template turns a conversation into the prompt text.

A template comes from the model file, so it is untrusted input. It renders in Jinja's
ImmutableSandboxedEnvironment (no access to underscore attributes such as __class__, no calls to
unsafe or mutating methods), with the settings Hugging Face's transformers uses for chat templates
(trim_blocks, lstrip_blocks, loop controls, `raise_exception`, `strftime_now`, a `tojson` that keeps
non-ASCII text), and inside limits the sandbox alone does not give:
  - time: a deadline checked on every line the compiled template executes (2 s by default);
  - output: the rendered text may not exceed a size cap;
  - one-shot growth: `*`, `**`, `+`, `%`, `~` and the width arguments of center/indent/format/
    ljust/rjust/zfill/expandtabs/str.format/tojson are checked before they allocate;
  - gradual growth: the process's resident memory may not grow more than 256 MiB while the
    template runs (read from /proc on Linux; elsewhere from the peak that getrusage reports);
  - everything else: by default the render runs in a child process (hipcore.tokenizer.chat_template_worker)
    with 1 GiB of address space and a CPU-time limit, killed at the deadline, so that even a single
    runaway C-level operation cannot hang or exhaust this process. It costs about 0.1-0.3 s per
    render; `isolated=False` renders in this process (for trusted templates).
Each limit ends the render with a one-line InvalidModelError (exit 3); a template that calls
raise_exception (e.g. "roles must alternate") gives a UsageError with its message.

A model without a template gets ChatML, the format of SmolLM2, Qwen and many others; callers
should say so (FALLBACK_NOTE).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from hipcore.tokenizer.chat_template_sandbox import (
    BASE_OUTPUT_CAP,
    DEFAULT_TIMEOUT_S,
    USAGE,
    describe_failure,
    render_sandboxed,
)
from hipcore.errors import InvalidModelError, RocmforgeError, UsageError

CHAT_TEMPLATE_KEY = "tokenizer.chat_template"

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
FALLBACK_NOTE = "the model has no chat template; formatting the conversation as ChatML (<|im_start|>role ... <|im_end|>)"

# Time for the child interpreter to start and import jinja2, on top of the render's own deadline.
CHILD_STARTUP_S = 10.0
_PROJECT_ROOT = str(Path(__file__).resolve().parent.parent)
_CHILD_BOOT = "import sys; sys.path.insert(0, sys.argv[1]); from hipcore.tokenizer.chat_template_worker import main; main()"


def chat_template_from_metadata(metadata: Mapping[str, object]) -> str | None:
    """The model's default chat template, or None when the file has none (or an empty one)."""
    value = metadata.get(CHAT_TEMPLATE_KEY)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidModelError(f"metadata key '{CHAT_TEMPLATE_KEY}' must be a string, found {type(value).__name__}")
    return value if value.strip() else None


def render_chat(
    template: str | None,
    messages: list[dict],
    *,
    bos_token: str,
    eos_token: str,
    add_generation_prompt: bool = True,
    timeout_s: float = DEFAULT_TIMEOUT_S,
    max_output_chars: int | None = None,
    isolated: bool = True,
) -> str:
    """Render `messages` ([{"role": ..., "content": ...}]) with `template` (None: ChatML)."""
    conversation = _checked_messages(messages)
    size = sum(len(m["role"]) + len(m["content"]) for m in conversation) + len(bos_token) + len(eos_token)
    max_chars = max_output_chars if max_output_chars is not None else BASE_OUTPUT_CAP + 4 * size
    context = {
        "messages": conversation,
        "bos_token": bos_token,
        "eos_token": eos_token,
        "add_generation_prompt": bool(add_generation_prompt),
    }
    source = template if template is not None else CHATML_TEMPLATE
    if isolated:
        return _render_in_child(source, context, timeout_s, max_chars)
    try:
        return render_sandboxed(source, context, timeout_s=timeout_s, max_chars=max_chars)
    except Exception as exc:  # an untrusted template can raise anything: each becomes one line
        kind, message = describe_failure(exc)
        raise (UsageError if kind == USAGE else InvalidModelError)(message) from None


def _render_in_child(template: str, context: dict, timeout_s: float, max_chars: int) -> str:
    request = json.dumps({"template": template, "context": context, "timeout_s": timeout_s, "max_chars": max_chars},
                         ensure_ascii=True)
    try:
        done = subprocess.run(
            [sys.executable, "-I", "-c", _CHILD_BOOT, _PROJECT_ROOT],
            input=request, capture_output=True, text=True, encoding="ascii", timeout=timeout_s + CHILD_STARTUP_S,
        )
    except subprocess.TimeoutExpired:
        raise InvalidModelError(
            f"the model's chat template was stopped: rendering took longer than {timeout_s:g} s"
        ) from None
    except OSError as exc:
        raise RocmforgeError(
            f"cannot start the chat-template renderer ({sys.executable}): {exc}; "
            "render with isolated=False only if the template is trusted"
        ) from None
    try:
        reply = json.loads(done.stdout)
    except ValueError:
        reply = None
    if done.returncode != 0 or not isinstance(reply, dict):
        ending = f"signal {-done.returncode}" if done.returncode < 0 else f"exit status {done.returncode}"
        raise InvalidModelError(
            f"the model's chat template was stopped: its renderer process ended abnormally ({ending}), "
            "most likely at its memory or CPU-time limit"
        )
    if "text" in reply:
        return str(reply["text"])
    message = str(reply.get("message", "the model's chat template failed"))
    raise (UsageError if reply.get("kind") == USAGE else InvalidModelError)(message)


def _checked_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict]:
    if not isinstance(messages, (list, tuple)):
        raise UsageError(f"messages must be a list of {{'role', 'content'}} dicts, got {type(messages).__name__}")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise UsageError(f"message {i} must be a dict with 'role' and 'content', got {type(message).__name__}")
        role, content = message.get("role"), message.get("content")
        if not isinstance(role, str) or not isinstance(content, str):
            raise UsageError(f"message {i} needs string 'role' and 'content' fields")
        out.append({"role": role, "content": content})
    return out
