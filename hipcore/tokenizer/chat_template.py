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
raise_exception (e.g. "roles must alternate") gives a UsageError with its message, its control
characters escaped (hipcore.errors.printable), as is all template text in a message.

Two size bounds, so that neither the render nor the tokenizing after it costs more than the input
justifies (a 20-byte template once rendered 4 MB of spaces, then spent a minute tokenizing them):
  - the template's allowance, what a template may add to the conversation: 16 Ki characters, plus
    per message and once more the template's own length and the BOS and EOS texts (each counted up
    to 4,096 characters, the longest token text a file may hold), plus four times the conversation. Past it, the template is at fault (InvalidModelError, exit 3), whatever the
    context. BOS and EOS texts are bounded when the file is read (Limits.max_token_chars).
  - the context's bound, given the context size in tokens: at most MAX_CHARS_PER_TOKEN (16)
    characters per token of context. Real text averages 3 to 4 characters a token (measured on the
    demo model's vocabulary: prose 3.2, Python 3.6, C++ 2.9); only long runs of one character (64
    spaces in one token) reach more. Past it, the prompt cannot fit: a UsageError (exit 2) that
    says to shorten it or raise the context, before a single token is computed. Tokenizing what
    passes costs at most ~17 us a character (the worst case measured, a run of spaces): about 1 s
    for a 4,096-token context.

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
from hipcore.errors import InvalidModelError, RocmforgeError, UsageError, printable
from hipcore.tokenizer.tokenizer import Tokenizer

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
_PROJECT_ROOT = str(Path(__file__).resolve().parents[2])  # the directory that holds the hipcore package
MAX_CHARS_PER_TOKEN = 16
TEMPLATE_SLACK_CHARS = 16 << 10
TOKEN_TEXT_CHARS = 4096  # hipcore.gguf.header.Limits.max_token_chars (a test keeps them equal)
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
    context_tokens: int | None = None,
    isolated: bool = True,
    tools: list[dict] | None = None,
    template_kwargs: Mapping[str, Any] | None = None,
) -> str:
    """Render `messages` ([{"role": ..., "content": ...}]) with `template` (None: ChatML). tools: OpenAI's
    function tools, which the template receives as `tools` (as transformers' apply_chat_template passes them);
    messages may then carry tool_calls (assistant) and tool_call_id (tool results). template_kwargs: more
    variables for the template (e.g. Qwen3's enable_thinking), as apply_chat_template's extra keyword arguments;
    none may name a variable the render sets itself (checked_template_kwargs).

    max_output_chars replaces the template's allowance (see the module's notes); context_tokens,
    when given, bounds the result by the context (MAX_CHARS_PER_TOKEN characters a token)."""
    conversation = checked_messages(messages)
    template_kwargs = checked_template_kwargs(template_kwargs)
    conversation_chars = conversation_size(conversation, tools, template_kwargs)
    context_chars = None if context_tokens is None else context_tokens * MAX_CHARS_PER_TOKEN
    if context_chars is not None and conversation_chars > context_chars:
        raise UsageError(f"the conversation has {conversation_chars:,} characters, more than a context of "
                         f"{context_tokens:,} tokens can hold ({context_chars:,} at most): "
                         "shorten the prompt or raise --ctx-size")
    source = template if template is not None else CHATML_TEMPLATE
    max_chars = max_output_chars if max_output_chars is not None else template_allowance(
        source, len(conversation), conversation_chars, bos_token, eos_token)
    context = template_context(conversation, bos_token=bos_token, eos_token=eos_token,
                               add_generation_prompt=add_generation_prompt, tools=tools, template_kwargs=template_kwargs)
    if isolated:
        text = _render_in_child(source, context, timeout_s, max_chars)
    else:
        try:
            text = render_sandboxed(source, context, timeout_s=timeout_s, max_chars=max_chars)
        except Exception as exc:  # an untrusted template can raise anything: each becomes one line
            kind, message = describe_failure(exc)
            raise (UsageError if kind == USAGE else InvalidModelError)(printable(message)) from None
    if context_chars is not None and len(text) > context_chars:
        raise UsageError(f"the prompt as the model's chat template formats it has {len(text):,} characters, more "
                         f"than a context of {context_tokens:,} tokens can hold ({context_chars:,} at most): "
                         "shorten the prompt or raise --ctx-size")
    return text


def template_allowance(template: str, n_messages: int, conversation_chars: int, bos_token: str,
                       eos_token: str) -> int:
    """The most characters a template may render for a conversation (see the module's notes): what
    it writes of its own comes from its source, once per message and once around them."""
    # A BOS or EOS text counts up to the longest token text a valid file holds (GGUF
    # Limits.max_token_chars), so that no BOS text can widen the allowance past that.
    per_message = len(template) + min(len(bos_token), TOKEN_TEXT_CHARS) + min(len(eos_token), TOKEN_TEXT_CHARS)
    return TEMPLATE_SLACK_CHARS + (n_messages + 1) * per_message + 4 * conversation_chars


def chat_prompt(tokenizer: Tokenizer, template: str | None, messages: list[dict], *, context_tokens: int,
                **render_options: Any) -> tuple[str, list[int]]:
    """The text and token ids of a conversation rendered with the model's template, bounded by the context
    on the way (render_chat), with the model's own BOS and EOS texts. A template that turns a
    conversation with text into nothing (or only whitespace) is the model file's fault: InvalidModelError."""
    bos = tokenizer.token_text(tokenizer.bos_id) if tokenizer.bos_id is not None else ""
    eos = tokenizer.token_text(tokenizer.eos_id) if tokenizer.eos_id is not None else ""
    text = render_chat(template, messages, bos_token=bos, eos_token=eos, context_tokens=context_tokens,
                       **render_options)
    if not text.strip() and any(m["content"].strip() for m in messages):
        raise InvalidModelError("the model's chat template produced an empty prompt (nothing but whitespace) "
                                "from a conversation with text")
    return text, encode_chat(tokenizer, text)


def encode_chat(tokenizer: Tokenizer, text: str) -> list[int]:
    """Token ids of a conversation as the chat template rendered it. A template that writes the BOS text itself
    (Llama 3's, Gemma's) on a model whose tokenizer adds a BOS (as their GGUFs say) would begin the prompt with two
    BOS tokens: the template's is dropped first, as llama.cpp's chat templates do (common/chat.cpp)."""
    if tokenizer.add_bos and tokenizer.bos_id is not None:
        text = text.removeprefix(tokenizer.token_text(tokenizer.bos_id))
    return tokenizer.encode(text)


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
    message = printable(str(reply.get("message", "the model's chat template failed")))
    raise (UsageError if reply.get("kind") == USAGE else InvalidModelError)(message)


def conversation_size(conversation: list[dict], tools: list[dict] | None,
                      template_kwargs: Mapping[str, Any] | None = None) -> int:
    """The characters a template may repeat of the conversation: its texts, tool calls, tools and extra variables."""
    chars = sum(len(m["role"]) + len(m["content"]) + len(m.get("thinking", "")) for m in conversation)
    extras = [m["tool_calls"] for m in conversation if "tool_calls" in m]
    if tools or extras:
        chars += len(json.dumps([tools or [], extras]))
    if template_kwargs:
        chars += len(json.dumps(template_kwargs))
    return chars


# The variables a render sets itself, and the sandbox's functions: a template's extra variables never replace them
# (a request's messages, tools and add_generation_prompt are its own fields; llama-server's and vLLM's
# chat_template_kwargs are for the template's own switches, such as Qwen3's enable_thinking).
RENDER_VARIABLES = ("messages", "tools", "add_generation_prompt", "bos_token", "eos_token")
SANDBOX_NAMES = ("raise_exception", "strftime_now", "range", "dict", "lipsum", "cycler", "joiner", "namespace")


def checked_template_kwargs(template_kwargs: Mapping[str, Any] | None) -> dict:
    """The extra variables of a render, as a dict; a UsageError naming one that would replace a render's own."""
    if template_kwargs is None:
        return {}
    if not isinstance(template_kwargs, Mapping):
        raise UsageError(f"the chat template's extra variables must be an object, got {type(template_kwargs).__name__}")
    for name in template_kwargs:
        if not isinstance(name, str):
            raise UsageError("the chat template's extra variables must have string names")
        if name in RENDER_VARIABLES or name in SANDBOX_NAMES:
            raise UsageError(f"{printable(name[:64])} is set by the render itself; an extra variable cannot "
                             "replace it")
    return dict(template_kwargs)


def template_context(conversation: list[dict], *, bos_token: str, eos_token: str, add_generation_prompt: bool,
                     tools: list[dict] | None, template_kwargs: Mapping[str, Any] | None) -> dict:
    """The variables a template renders with: the extra ones first, the render's own over them."""
    context = dict(template_kwargs or {})
    context.update(messages=conversation, bos_token=bos_token, eos_token=eos_token,
                   add_generation_prompt=bool(add_generation_prompt))
    if tools:
        context["tools"] = tools
    return context


def checked_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict]:
    if not isinstance(messages, (list, tuple)):
        raise UsageError(f"messages must be a list of {{'role', 'content'}} dicts, got {type(messages).__name__}")
    out = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise UsageError(f"message {i} must be a dict with 'role' and 'content', got {type(message).__name__}")
        role, content = message.get("role"), message.get("content")
        if content is None and message.get("tool_calls"):
            content = ""
        if not isinstance(role, str) or not isinstance(content, str):
            raise UsageError(f"message {i} needs string 'role' and 'content' fields")
        checked = {"role": role, "content": content}
        for extra in ("tool_calls", "tool_call_id", "name"):  # a tool call's and a tool result's fields
            if message.get(extra) is not None:
                checked[extra] = message[extra]
        if isinstance(message.get("thinking"), str):  # gpt-oss's template: the reasoning before a call
            checked["thinking"] = message["thinking"]
        out.append(checked)
    return out
