"""Chat templates: SmolLM2's own template against llama.cpp / llama-cpp-python, the ChatML
fallback, and hostile templates that must end in a clear error without escaping the sandbox.

How the expected prompts were checked: scripts/golden/record_tokenizer.py applied SmolLM2's
embedded template with llama-cpp-python's Jinja2ChatFormatter (the same Jinja settings as
Hugging Face transformers) and with llama.cpp's built-in llama_chat_apply_template (which
recognises the template as ChatML). Both are in tests/golden/tokenizer_chat_template_smollm2.json.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from hipcore.tokenizer.chat_template import CHATML_TEMPLATE, chat_template_from_metadata, render_chat
from hipcore.errors import InvalidModelError, UsageError
from hipcore.gguf.file import read_plan

GOLDEN = json.loads((Path(__file__).parent / "golden" / "tokenizer_chat_template_smollm2.json").read_text("utf-8"))
USER = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def smollm_template(demo_model_path: Path) -> str:
    template = chat_template_from_metadata(read_plan(demo_model_path).metadata)
    assert template is not None
    return template


def _render(template: str | None, messages=USER, **kwargs) -> str:
    return render_chat(template, messages, bos_token="<s>", eos_token="</s>", **kwargs)


def test_smollm2_template_is_the_recorded_one(smollm_template):
    assert smollm_template == GOLDEN["template"]


@pytest.mark.parametrize("case", GOLDEN["cases"], ids=lambda c: f"{len(c['messages'])}msg-gen{c['add_generation_prompt']}")
def test_smollm2_template_renders_like_llama_cpp_python(smollm_template, case):
    out = render_chat(smollm_template, case["messages"], bos_token=GOLDEN["bos_token"],
                      eos_token=GOLDEN["eos_token"], add_generation_prompt=case["add_generation_prompt"])
    assert out == case["jinja_llama_cpp_python"]
    if case["messages"][0]["role"] == "system":
        # With a system message the template is plain ChatML, as llama.cpp's formatter says.
        assert out == case["llama_cpp_builtin"]


def test_system_and_user_conversation_exactly(smollm_template):
    out = render_chat(smollm_template, [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
                      bos_token="<|im_start|>", eos_token="<|im_end|>")
    assert out == "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"


def test_without_a_template_chatml_is_used():
    assert chat_template_from_metadata({}) is None
    assert chat_template_from_metadata({"tokenizer.chat_template": "  "}) is None
    with pytest.raises(InvalidModelError, match="tokenizer.chat_template"):
        chat_template_from_metadata({"tokenizer.chat_template": 5})
    system_user = next(c for c in GOLDEN["cases"] if c["messages"][0]["role"] == "system" and c["add_generation_prompt"])
    out = render_chat(None, system_user["messages"], bos_token="", eos_token="")
    assert out == system_user["llama_cpp_builtin"]
    assert _render(CHATML_TEMPLATE) == _render(None)


def test_hugging_face_template_features():
    template = (
        "{{ bos_token }}{% for m in messages %}{% if loop.index > 1 %}{% break %}{% endif %}"
        "{{ m | tojson }}{% endfor %}|{{ strftime_now('%Y') }}|{{ eos_token }}"
        "{% generation %}G{% endgeneration %}"
    )
    out = _render(template, [{"role": "user", "content": "héllo"}, {"role": "user", "content": "second"}], isolated=False)
    assert out == '<s>{"role": "user", "content": "héllo"}|' + time.strftime("%Y") + "|</s>G"


@pytest.mark.parametrize("isolated", [True, False], ids=["child", "in-process"])
def test_raise_exception_is_a_usage_error(isolated):
    template = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('Roles must alternate') }}{% endif %}"
    with pytest.raises(UsageError, match="rejected the conversation: Roles must alternate"):
        _render(template, isolated=isolated)


@pytest.mark.parametrize("messages", [
    "hello",
    [{"role": "user"}],
    [{"role": "user", "content": 5}],
    ["hello"],
])
def test_malformed_messages_are_usage_errors(messages):
    with pytest.raises(UsageError):
        _render(None, messages)


HOSTILE = {
    "nested loop without output": "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
    "nested loop with output": "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
    "subclasses via a string": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
    "globals via cycler": "{{ cycler.__init__.__globals__ }}",
    "mutating a list": "{% set l = [] %}{{ l.append(1) }}",
    "repeated string": "{{ 'a' * 1000000000 }}",
    "doubling with ~": "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
    "doubling with +": "{% set ns = namespace(s='x') %}{% for i in range(60) %}{% set ns.s = ns.s + ns.s %}{% endfor %}",
    "doubling by block set": "{% set ns = namespace(s='x' * 1000) %}{% for i in range(60) %}{% set t %}{{ ns.s }}"
                             "{{ ns.s }}{% endset %}{% set ns.s = t %}{% endfor %}",
    "huge power": "{{ 10 ** 100000000 }}",
    "squaring": "{% set ns = namespace(x=3) %}{% for i in range(40) %}{% set ns.x = ns.x * ns.x %}{% endfor %}",
    "center filter": "{{ 'x' | center(1000000000) }}",
    "str.center": "{{ 'x'.center(1000000000) }}",
    "str.format width": "{{ '{:>1000000000}'.format('x') }}",
    "str.format nested width": "{{ '{:>{}}'.format('x', 1000000000) }}",
    "percent width": "{{ '%1000000000s' % 'x' }}",
    "indent filter": "{{ 'a\nb' | indent(1000000000) }}",
    "tojson indent": "{{ messages | tojson(indent=1000000000) }}",
    "lipsum": "{{ lipsum(1000000) }}",
    "recursion": "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "syntax error": "{% for x in %}",
    "unknown filter": "{{ messages | no_such_filter }}",
}


# Single C-level operations on values that share structure exponentially: no Python line runs
# while they do, so only the child process's CPU-time and address-space limits stop them.
HOSTILE_IN_C = {
    "exponential comparison": "{% set ns = namespace(a=[1], b=[1]) %}{% for i in range(60) %}"
                              "{% set ns.a = [ns.a, ns.a] %}{% set ns.b = [ns.b, ns.b] %}{% endfor %}{{ ns.a == ns.b }}",
    "exponential printing": "{% set ns = namespace(a=[1]) %}{% for i in range(60) %}"
                            "{% set ns.a = [ns.a, ns.a] %}{% endfor %}{{ ns.a }}",
}


@pytest.mark.parametrize("isolated", [True, False], ids=["child", "in-process"])
@pytest.mark.parametrize("name", list(HOSTILE))
def test_hostile_templates_end_in_a_clear_error(name, isolated):
    trace_before = sys.gettrace()
    start = time.perf_counter()
    with pytest.raises(InvalidModelError) as caught:
        _render(HOSTILE[name], timeout_s=0.5, isolated=isolated)
    elapsed = time.perf_counter() - start
    message = str(caught.value)
    assert message.startswith("the model's chat template") and "\n" not in message
    assert elapsed < 4.0, f"{name} took {elapsed:.1f} s"
    assert sys.gettrace() is trace_before  # the render's tracer is gone


@pytest.mark.parametrize("name", list(HOSTILE_IN_C))
def test_runaway_c_level_operations_are_stopped_by_the_child_process(name):
    start = time.perf_counter()
    with pytest.raises(InvalidModelError, match="stopped") as caught:
        _render(HOSTILE_IN_C[name], timeout_s=0.5)
    assert "\n" not in str(caught.value)
    assert time.perf_counter() - start < 15.0


def test_unsafe_attributes_never_reveal_anything():
    for template in ("{{ messages.__class__ }}", "{{ messages | attr('__class__') }}", "{{ bos_token.__doc__ }}"):
        assert _render(template, isolated=False) == ""
    with pytest.raises(InvalidModelError, match="unsafe"):
        _render("{{ messages.__class__.__mro__ }}", isolated=False)


@pytest.mark.parametrize("isolated", [True, False], ids=["child", "in-process"])
def test_output_is_capped(isolated):
    with pytest.raises(InvalidModelError, match="exceed 100 characters"):
        _render("{% for i in range(1000) %}xx{% endfor %}", max_output_chars=100, isolated=isolated)
    assert _render("{% for i in range(50) %}xx{% endfor %}", max_output_chars=100, isolated=isolated) == "xx" * 50


def test_ordinary_formatting_with_big_numbers_still_works():
    template = "{{ '%d|%5s' % (123456789012, 'x') }} {{ '{}-{:>3}'.format(123456789012, 'y') }} {{ '%s' | format(10**11) }}"
    assert _render(template, isolated=False) == "123456789012|    x 123456789012-  y 100000000000"


def test_child_and_in_process_renders_agree_on_unusual_text():
    messages = [{"role": "user", "content": "é 中文 🙂 \\ \" ' \udcff"}]
    template = "{{ messages[0]['content'] }}|{{ messages | tojson }}"
    assert _render(template, messages) == _render(template, messages, isolated=False)


@pytest.mark.parametrize("add_bos", [True, False])
def test_a_template_that_writes_bos_gives_one_bos_token(tmp_path, add_bos):
    """Llama 3's and Gemma's templates write the BOS text; where the tokenizer adds a BOS too (as their GGUFs say),
    the prompt still begins with one, as llama.cpp's chat templates give it; where it does not, the template's
    BOS is the one. With the template's BOS kept (planted), the first case begins with two and fails."""
    from support.gguf_factory import write_tiny_llama
    from hipcore.tokenizer.chat_template import chat_prompt
    from hipcore.tokenizer.tokenizer import Tokenizer

    template = "{{ bos_token }}{% for m in messages %}[{{ m.role }}] {{ m.content }}{% endfor %}"
    path = write_tiny_llama(tmp_path / "bos.gguf", extra_metadata={"tokenizer.ggml.add_bos_token": add_bos,
                                                                   "tokenizer.chat_template": template})
    tokenizer = Tokenizer.from_metadata(read_plan(path).metadata)
    text, ids = chat_prompt(tokenizer, template, USER, context_tokens=256, isolated=False)
    assert text.startswith(tokenizer.token_text(tokenizer.bos_id))
    assert ids[0] == tokenizer.bos_id and ids.count(tokenizer.bos_id) == 1, ids
    assert ids == tokenizer.encode(text, add_bos=False)
    assert tokenizer.encode(text).count(tokenizer.bos_id) == (2 if add_bos else 1)  # what encoding alone gives
