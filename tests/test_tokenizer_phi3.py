"""Phi-3's special tokens swallow the whitespace after them in llama.cpp (the RSTRIP attribute it gives every
special token of a model named "phi-3"/"phi3", and "</s>", but not "<unk>", "<s>", "<|endoftext|>"):
"<|user|>\\nHello" encodes as <|user|> "Hello", with no newline token. Our ids against llama.cpp's on the tiny
Phi-3-style vocabulary of tests/support/phi3_vocab.py, under a Phi-3 name and under another (where nothing is
stripped), recorded by scripts/golden/record_tokenizer_phi3.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from hipcore.tokenizer import vocab
from hipcore.tokenizer.tokenizer import Tokenizer
from support.phi3_vocab import NAMES, TEXTS, phi3_vocab_metadata

GOLDEN = json.loads((Path(__file__).parent / "golden" / "tokenizer_phi3.json").read_text(encoding="utf-8"))


def test_the_golden_data_is_for_these_texts_and_the_rule_shows_in_it():
    assert GOLDEN["texts"] == list(TEXTS)
    assert GOLDEN["ids"]["phi3"] != GOLDEN["ids"]["other"], "the texts must be ones the rule changes"


@pytest.mark.parametrize("key", NAMES)
def test_our_ids_are_llamacpps(key):
    tok = Tokenizer.from_metadata(phi3_vocab_metadata(NAMES[key]))
    assert [tok.encode(text) for text in TEXTS] == GOLDEN["ids"][key]


def test_the_rule_follows_the_name_in_any_case():
    for name in ("Phi-3 Mini 4k Instruct", "PHI3"):
        tok = Tokenizer.from_metadata(phi3_vocab_metadata(name))
        assert [tok.encode(text) for text in TEXTS] == GOLDEN["ids"]["phi3"], name


def test_without_the_rule_the_phi3_ids_are_missed(monkeypatch):
    """Planted fault: no per-model attributes; the Phi-3-named vocabulary then encodes as any other."""
    monkeypatch.setattr(vocab, "_set_model_attributes", lambda *args: None)
    tok = Tokenizer.from_metadata(phi3_vocab_metadata("Phi3"))
    assert [tok.encode(text) for text in TEXTS] != GOLDEN["ids"]["phi3"]
