"""The vocabulary of a GGUF model, read from its `tokenizer.ggml.*` metadata and checked.

This module turns the metadata mapping into a frozen `Vocabulary`: token texts, scores, token
attributes, the special ids (BOS, EOS, end-of-generation ...) and the flags that steer encoding
and decoding. The defaults follow llama.cpp's vocabulary loader, so that a model tokenizes here
exactly as it does there: a token id that differs is a different prompt.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from hipcore.errors import InvalidModelError, UnsupportedModelError, printable
from hipcore.tokenizer.bpe import PreTokenizer, resolve_pretokenizer

# Token attributes (bit flags), one value per GGUF token type.
ATTR_UNDEFINED = 0
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
# Not from the file: llama.cpp sets these per model (llama-vocab.cpp, "per token attributes"). A special
# token with LSTRIP swallows the whitespace before it in the text, with RSTRIP the whitespace after it.
ATTR_LSTRIP = 1 << 7
ATTR_RSTRIP = 1 << 8

# GGUF tokenizer.ggml.token_type values -> attributes; any other value is "undefined".
_TYPE_TO_ATTR = {
    1: ATTR_NORMAL,
    2: ATTR_UNKNOWN,
    3: ATTR_CONTROL,
    4: ATTR_USER_DEFINED,
    5: ATTR_UNUSED,
    6: ATTR_BYTE,
}

KEY = "tokenizer.ggml."

# Converters often leave end-of-turn and fill-in-the-middle tokens out of the metadata; llama.cpp
# finds them by their text, and so must we, or generation would run past the end of a turn.
_EOT_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
    "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>",
)
_EOM_TEXTS = ("<|eom_id|>",)
_FIM_PAD_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
_FIM_REP_TEXTS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
_FIM_SEP_TEXTS = ("<|file_sep|>",)
# Texts that end generation wherever they appear in a vocabulary.
_EOG_TEXTS = frozenset((
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
))
# gpt-oss marks these as control, but their text belongs in the output.
_ALWAYS_RENDERED_TEXTS = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")

SUPPORTED_MODELS = ("gpt2", "llama")


@dataclass(frozen=True)
class Vocabulary:
    """Everything the encoder and decoder need, validated once."""

    model: str  # "gpt2" (byte-level BPE) or "llama" (SentencePiece-style)
    pretokenizer: PreTokenizer | None  # for "gpt2" only
    tokens: tuple[str, ...]
    token_to_id: Mapping[str, int]
    scores: tuple[float, ...]  # empty when the file has none (then every score is 0)
    attrs: tuple[int, ...]
    merges: tuple[str, ...]  # "left right" pairs in rank order, for "gpt2"
    bos_id: int | None
    eos_id: int | None
    unk_id: int | None
    pad_id: int | None
    eog_ids: frozenset[int]
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    clean_spaces: bool
    # Ids matched as whole tokens inside text, longest text first (equal lengths by id).
    special_ids: tuple[int, ...]
    notes: tuple[str, ...]  # things worth telling the user (a default taken, a fallback used)


def read_vocabulary(metadata: Mapping[str, object]) -> Vocabulary:
    """Build and check the vocabulary; InvalidModelError / UnsupportedModelError name the key."""
    notes: list[str] = []
    model = _get_str(metadata, KEY + "model")
    if model is None:
        raise InvalidModelError(f"the model has no tokenizer: metadata key '{KEY}model' is missing")
    if model not in SUPPORTED_MODELS:
        raise UnsupportedModelError(
            f"tokenizer type '{printable(model, 60)}' ({KEY}model) is not supported; supported: {', '.join(SUPPORTED_MODELS)}"
        )

    tokens = _get_str_array(metadata, KEY + "tokens", required=True)
    n_vocab = len(tokens)
    if n_vocab == 0:
        raise InvalidModelError(f"'{KEY}tokens' is empty: the vocabulary has no tokens")
    # llama.cpp renames empty tokens so that every id keeps a distinct text.
    tokens = tuple(t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens))
    token_to_id = {text: i for i, text in enumerate(tokens)}
    if len(token_to_id) != n_vocab:
        seen: set[str] = set()
        for i, text in enumerate(tokens):
            if text in seen:
                raise InvalidModelError(f"'{KEY}tokens' holds the token '{printable(text, 60)}' twice (again at id {i})")
            seen.add(text)

    scores = _get_number_array(metadata, KEY + "scores", n_vocab)
    types = _get_int_array(metadata, KEY + "token_type", n_vocab)
    attrs = [ATTR_NORMAL] * n_vocab if types is None else [_TYPE_TO_ATTR.get(t, ATTR_UNDEFINED) for t in types]

    pretokenizer: PreTokenizer | None = None
    merges: tuple[str, ...] = ()
    if model == "gpt2":
        pre_name = _get_str(metadata, KEY + "pre")
        if pre_name is None:
            notes.append("the model names no pre-tokenizer (tokenizer.ggml.pre); using 'default' as llama.cpp does")
        pretokenizer = resolve_pretokenizer(pre_name)
        merges = _get_str_array(metadata, KEY + "merges", required=True)
        add_bos, add_space_prefix, clean_spaces = pretokenizer.add_bos, False, pretokenizer.clean_spaces
        bos_default, eos_default, unk_default = 11, 11, None
    else:
        add_bos, add_space_prefix, clean_spaces = True, True, False
        bos_default, eos_default, unk_default = 1, 2, 0
    add_eos = False

    add_space_prefix = _get_bool(metadata, KEY + "add_space_prefix", add_space_prefix)

    def special(name: str, default: int | None) -> int | None:
        if default is not None and default >= n_vocab:
            default = None
        value = _get_int(metadata, KEY + name)
        if value is None:
            return default
        if not 0 <= value < n_vocab:
            notes.append(f"{KEY}{name} = {value} is outside the vocabulary (0..{n_vocab - 1}); ignored")
            return default
        return value

    bos_id = special("bos_token_id", bos_default)
    eos_id = special("eos_token_id", eos_default)
    unk_id = special("unknown_token_id", unk_default)
    pad_id = special("padding_token_id", None)
    eot_id = special("eot_token_id", None)
    eom_id = special("eom_token_id", None)
    fim_pad_id = special("fim_pad_token_id", None)
    fim_rep_id = special("fim_rep_token_id", None)
    fim_sep_id = special("fim_sep_token_id", None)

    add_bos = _get_bool(metadata, KEY + "add_bos_token", add_bos)
    add_eos = _get_bool(metadata, KEY + "add_eos_token", add_eos)
    if add_bos and bos_id is None:
        raise InvalidModelError(f"'{KEY}add_bos_token' asks for a BOS token but the model has none")
    if add_eos and eos_id is None:
        raise InvalidModelError(f"'{KEY}add_eos_token' asks for an EOS token but the model has none")

    def find(texts: tuple[str, ...], current: int | None) -> int | None:
        if current is not None:
            return current
        for text in texts:
            if text in token_to_id:
                found = token_to_id[text]
                attrs[found] |= ATTR_CONTROL  # a turn marker must never be split or printed as text
                return found
        return None

    eot_id = find(_EOT_TEXTS, eot_id)
    eom_id = find(_EOM_TEXTS, eom_id)
    fim_pad_id = find(_FIM_PAD_TEXTS, fim_pad_id)
    fim_rep_id = find(_FIM_REP_TEXTS, fim_rep_id)
    fim_sep_id = find(_FIM_SEP_TEXTS, fim_sep_id)

    eog = {i for i in (fim_pad_id, fim_rep_id, fim_sep_id, eos_id, eot_id, eom_id) if i is not None}
    for text in _EOG_TEXTS:
        found = token_to_id.get(text)
        if found is not None:
            eog.add(found)
            attrs[found] |= ATTR_CONTROL
    for text in _ALWAYS_RENDERED_TEXTS:
        if text in token_to_id:
            attrs[token_to_id[text]] = ATTR_USER_DEFINED
    eog_texts = {tokens[i] for i in eog}
    # Harmony-style vocabularies end a message with <|end|> but a turn with <|return|>/<|call|>.
    has_call = "<|call|>" in eog_texts or "<|calls|>" in eog_texts
    if "<|end|>" in eog_texts and has_call and ("<|return|>" in eog_texts or "<|flush|>" in eog_texts):
        end_id = token_to_id["<|end|>"]
        eog.discard(end_id)
        attrs[end_id] = ATTR_USER_DEFINED
    # Where </s> is an ordinary token next to a real end marker, it must not stop generation.
    if "</s>" in eog_texts and eog_texts & {"<|tool_response>", "<|plamo:eos|>"}:
        s_id = token_to_id["</s>"]
        eog.discard(s_id)
        attrs[s_id] = ATTR_NORMAL

    matched = ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN
    special_ids = sorted((i for i in range(n_vocab) if attrs[i] & matched), key=lambda i: (-len(tokens[i]), i))
    _set_model_attributes(metadata, attrs, token_to_id, special_ids)

    return Vocabulary(
        model=model,
        pretokenizer=pretokenizer,
        tokens=tokens,
        token_to_id=token_to_id,
        scores=scores or (),
        attrs=tuple(attrs),
        merges=merges,
        bos_id=bos_id,
        eos_id=eos_id,
        unk_id=unk_id,
        pad_id=pad_id,
        eog_ids=frozenset(eog),
        add_bos=add_bos,
        add_eos=add_eos,
        add_space_prefix=add_space_prefix,
        clean_spaces=clean_spaces,
        special_ids=tuple(special_ids),
        notes=tuple(notes),
    )


def _set_model_attributes(metadata: Mapping[str, object], attrs: list[int], token_to_id: Mapping[str, int],
                          special_ids: list[int]) -> None:
    """The strip attributes llama.cpp gives special tokens by the model's name. Phi-3 (a general.name containing
    "phi-3" or "phi3", any case): every special token swallows the whitespace after it, as do "</s>", but not
    "<unk>", "<s>" or "<|endoftext|>" (so "<|user|>\nHello" encodes as <|user|> "Hello"). llama.cpp fails to
    load a file so named that lacks one of those four tokens; here a missing one is skipped."""
    name = (_get_str(metadata, "general.name") or "").lower()
    if "phi-3" not in name and "phi3" not in name:
        return
    for i in special_ids:
        attrs[i] |= ATTR_RSTRIP
    for text, strip in (("</s>", True), ("<unk>", False), ("<s>", False), ("<|endoftext|>", False)):
        if text in token_to_id:
            i = token_to_id[text]
            attrs[i] = attrs[i] | ATTR_RSTRIP if strip else attrs[i] & ~ATTR_RSTRIP


# --- typed metadata access: every wrong type is an InvalidModelError naming the key -------------


def _type_name(value: object) -> str:
    return type(value).__name__


def _get_str(metadata: Mapping[str, object], key: str) -> str | None:
    value = metadata.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise InvalidModelError(f"metadata key '{key}' must be a string, found {_type_name(value)}")
    return value


def _get_bool(metadata: Mapping[str, object], key: str, default: bool) -> bool:
    value = metadata.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidModelError(f"metadata key '{key}' must be a bool, found {_type_name(value)}")
    return value


def _get_int(metadata: Mapping[str, object], key: str) -> int | None:
    value = metadata.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidModelError(f"metadata key '{key}' must be an integer, found {_type_name(value)}")
    return value


def _get_array(metadata: Mapping[str, object], key: str) -> tuple | None:
    value = metadata.get(key)
    if value is None:
        return None
    if not isinstance(value, (tuple, list)):
        raise InvalidModelError(f"metadata key '{key}' must be an array, found {_type_name(value)}")
    return tuple(value)


def _get_str_array(metadata: Mapping[str, object], key: str, *, required: bool) -> tuple[str, ...]:
    values = _get_array(metadata, key)
    if values is None:
        if required:
            raise InvalidModelError(f"metadata key '{key}' is missing; the tokenizer cannot be built without it")
        return ()
    for i, item in enumerate(values):
        if not isinstance(item, str):
            raise InvalidModelError(f"metadata key '{key}' must hold strings; item {i} is {_type_name(item)}")
    return values


def _check_length(key: str, values: tuple, n_vocab: int) -> None:
    if len(values) < n_vocab:
        raise InvalidModelError(
            f"metadata key '{key}' has {len(values)} entries but the vocabulary has {n_vocab} tokens"
        )


def _get_number_array(metadata: Mapping[str, object], key: str, n_vocab: int) -> tuple[float, ...] | None:
    values = _get_array(metadata, key)
    if values is None:
        return None
    _check_length(key, values, n_vocab)
    for i, item in enumerate(values[:n_vocab]):
        if isinstance(item, bool) or not isinstance(item, (int, float)):
            raise InvalidModelError(f"metadata key '{key}' must hold numbers; item {i} is {_type_name(item)}")
    return tuple(float(v) for v in values[:n_vocab])


def _get_int_array(metadata: Mapping[str, object], key: str, n_vocab: int) -> tuple[int, ...] | None:
    values = _get_array(metadata, key)
    if values is None:
        return None
    _check_length(key, values, n_vocab)
    for i, item in enumerate(values[:n_vocab]):
        if isinstance(item, bool) or not isinstance(item, int):
            raise InvalidModelError(f"metadata key '{key}' must hold integers; item {i} is {_type_name(item)}")
    return values[:n_vocab]
