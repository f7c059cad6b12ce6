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
    template runs (read from /proc on Linux; elsewhere from the peak that getrusage reports).
Each limit ends the render with a one-line InvalidModelError (exit 3); a template that calls
raise_exception (e.g. "roles must alternate") gives a UsageError with its message.

A model without a template gets ChatML, the format of SmolLM2, Qwen and many others; callers
should say so (FALLBACK_NOTE).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from jinja2.exceptions import SecurityError, TemplateError

from hipcore.chat_template_sandbox import (
    BASE_OUTPUT_CAP,
    DEFAULT_TIMEOUT_S,
    Budget,
    LimitExceeded,
    RaisedByTemplate,
    compile_template,
    one_line,
)
from hipcore.errors import InvalidModelError, UsageError

CHAT_TEMPLATE_KEY = "tokenizer.chat_template"

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
FALLBACK_NOTE = "the model has no chat template; formatting the conversation as ChatML (<|im_start|>role ... <|im_end|>)"

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
) -> str:
    """Render `messages` ([{"role": ..., "content": ...}]) with `template` (None: ChatML)."""
    conversation = _checked_messages(messages)
    size = sum(len(m["role"]) + len(m["content"]) for m in conversation) + len(bos_token) + len(eos_token)
    cap = max_output_chars if max_output_chars is not None else BASE_OUTPUT_CAP + 4 * size
    compiled = compile_template(template if template is not None else CHATML_TEMPLATE)
    context = {
        "messages": conversation,
        "bos_token": bos_token,
        "eos_token": eos_token,
        "add_generation_prompt": bool(add_generation_prompt),
    }
    budget = Budget(timeout_s, cap)
    try:
        with budget:
            pieces: list[str] = []
            produced = 0
            for chunk in compiled.generate(context):
                produced += len(chunk)
                budget.check_size(produced, "the rendered prompt")
                pieces.append(chunk)
            return "".join(pieces)
    except RaisedByTemplate as exc:
        raise UsageError(f"the model's chat template rejected the conversation: {exc}") from None
    except LimitExceeded as exc:
        raise InvalidModelError(f"the model's chat template was stopped: {exc}") from None
    except SecurityError as exc:
        raise InvalidModelError(f"the model's chat template tried an unsafe operation and was stopped: {exc}") from None
    except RecursionError:
        raise InvalidModelError("the model's chat template recursed too deeply and was stopped") from None
    except MemoryError:
        raise InvalidModelError("the model's chat template ran out of memory and was stopped") from None
    except (TemplateError, TypeError, ValueError, KeyError, IndexError, AttributeError, OverflowError,
            ZeroDivisionError) as exc:
        raise InvalidModelError(f"the model's chat template failed: {type(exc).__name__}: {one_line(exc)}") from None


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
