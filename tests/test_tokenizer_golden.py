"""Our tokenizer against llama.cpp, on golden data recorded by scripts/golden/record_tokenizer.py.

Vocabularies: SmolLM2's own ("gpt2" byte-level BPE, pre-tokenizer "smollm"); SmolLM2's vocabulary
under five other pre-tokenizer names (gpt-2, llama-bpe, qwen2, default, starcoder); and a small
SentencePiece-style "llama" vocabulary (tests/golden/tokenizer_spm_vocab.json) in three flag
variants. For each string: ids with and without the model's BOS/EOS, ids with special tokens
not parsed, and the decoded bytes with special tokens rendered and skipped; for each vocabulary:
the BOS/EOS ids and flags, the end-of-generation set, and every token's piece (by digest).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from hipcore.gguf.file import read_plan
from hipcore.tokenizer.tokenizer import Tokenizer

GOLDEN = Path(__file__).parent / "golden"


def _golden(name: str) -> dict:
    return json.loads((GOLDEN / name).read_text(encoding="utf-8"))


def _as_metadata(values: dict) -> dict:
    """JSON lists -> tuples, as the GGUF reader gives arrays."""
    return {k: tuple(v) if isinstance(v, list) else v for k, v in values.items()}


@pytest.fixture(scope="module")
def demo_metadata(demo_model_path: Path) -> dict:
    return dict(read_plan(demo_model_path).metadata)


@pytest.fixture(scope="module")
def spm_metadata() -> dict:
    return _as_metadata(_golden("tokenizer_spm_vocab.json")["metadata"])


def _variant_metadata(base: dict, variant: dict) -> dict:
    metadata = {k: v for k, v in base.items() if k not in variant["removed"]}
    metadata.update(variant["overrides"])
    return metadata


def _bpe_variants() -> list[tuple[str, dict]]:
    data = _golden("tokenizer_bpe_variants.json")
    return [(v["overrides"]["tokenizer.ggml.pre"], v) for v in data["variants"]]


def _spm_variants() -> list[tuple[str, dict]]:
    data = _golden("tokenizer_spm.json")
    return [(json.dumps(v["overrides"], sort_keys=True), v) for v in data["variants"]]


def _mismatches(tok: Tokenizer, vocab: dict) -> list[str]:
    problems = []
    for case in vocab["cases"]:
        text = case["text"]
        checks = (
            ("ids (model's BOS/EOS)", tok.encode(text), case["ids_add_special"]),
            ("ids (no BOS/EOS)", tok.encode(text, add_bos=False, add_eos=False), case["ids_no_add_special"]),
            ("ids (specials as text)", tok.encode(text, add_bos=False, add_eos=False, parse_special=False),
             case["ids_no_parse_special"]),
            ("decode", tok.decode_bytes(case["ids_add_special"]).hex(), case["decoded_hex_with_special"]),
            ("decode skip_special", tok.decode_bytes(case["ids_add_special"], skip_special=True).hex(),
             case["decoded_hex_skip_special"]),
        )
        for what, got, want in checks:
            if got != want:
                problems.append(f"{what} of {text!r}: ours {got}, llama.cpp {want}")
    return problems


def _check_vocab_facts(tok: Tokenizer, vocab: dict) -> None:
    assert tok.vocab_size == vocab["n_vocab"]
    assert tok.bos_id == vocab["bos_id"]
    assert tok.eos_id == vocab["eos_id"]
    assert tok.add_bos == vocab["add_bos"]
    assert tok.add_eos == vocab["add_eos"]
    assert sorted(tok.eot_ids) == vocab["eog_ids"]
    assert all(tok.is_special(i) for i in vocab["control_ids"])


def _check_pieces(tok: Tokenizer, vocab: dict) -> None:
    for token_id, piece_hex in vocab["pieces_hex"].items():
        assert tok.token_piece(int(token_id)).hex() == piece_hex, f"piece of token {token_id}"
    block = vocab["piece_block_size"]
    for k, want in enumerate(vocab["piece_block_sha256"]):
        ids = range(k * block, min((k + 1) * block, tok.vocab_size))
        blob = b"".join(len(p).to_bytes(2, "little") + p for p in (tok.token_piece(i) for i in ids))
        assert hashlib.sha256(blob).hexdigest() == want, f"pieces of ids {ids.start}..{ids.stop - 1}"


def test_goldens_were_recorded_by_llama_cpp_with_enough_strings():
    for name in ("tokenizer_smollm2.json", "tokenizer_bpe_variants.json", "tokenizer_spm.json"):
        data = _golden(name)
        assert data["recorded_by"] == "scripts/golden/record_tokenizer.py"
        assert data["llama_cpp_python"]
        vocabs = [data["vocab"]] if "vocab" in data else [v["vocab"] for v in data["variants"]]
        for vocab in vocabs:
            assert len(vocab["cases"]) >= 60
            assert any(case["text"] == "" for case in vocab["cases"])


def test_smollm2_matches_llama_cpp(demo_metadata):
    vocab = _golden("tokenizer_smollm2.json")["vocab"]
    tok = Tokenizer.from_metadata(demo_metadata)
    assert tok.kind == "gpt2" and tok.pretokenizer == "smollm"
    _check_vocab_facts(tok, vocab)
    problems = _mismatches(tok, vocab)
    assert not problems, "\n".join(problems[:20])
    _check_pieces(tok, vocab)


@pytest.mark.parametrize("pre, variant", _bpe_variants(), ids=[name for name, _ in _bpe_variants()])
def test_bpe_pretokenizers_match_llama_cpp(demo_metadata, pre, variant):
    tok = Tokenizer.from_metadata(_variant_metadata(demo_metadata, variant))
    _check_vocab_facts(tok, variant["vocab"])
    problems = _mismatches(tok, variant["vocab"])
    assert not problems, "\n".join(problems[:20])


@pytest.mark.parametrize("flags, variant", _spm_variants(), ids=[name for name, _ in _spm_variants()])
def test_sentencepiece_vocab_matches_llama_cpp(spm_metadata, flags, variant):
    tok = Tokenizer.from_metadata(_variant_metadata(spm_metadata, variant))
    assert tok.kind == "llama"
    _check_vocab_facts(tok, variant["vocab"])
    problems = _mismatches(tok, variant["vocab"])
    assert not problems, "\n".join(problems[:20])
    _check_pieces(tok, variant["vocab"])


def test_the_goldens_exercise_what_they_claim(spm_metadata):
    """Guard against a golden set that passes because it tests nothing: byte fallback, spaces
    cleaned on decode, and special tokens kept whole must all occur in the recorded data."""
    spm = _golden("tokenizer_spm.json")["variants"][0]["vocab"]
    byte_ids = {i for i, t in enumerate(spm_metadata["tokenizer.ggml.token_type"]) if t == 6}
    assert any(set(case["ids_no_add_special"]) & byte_ids for case in spm["cases"])
    default = dict(_bpe_variants())["default"]["vocab"]
    assert any(bytes.fromhex(c["decoded_hex_with_special"]).decode() != c["text"] for c in default["cases"])
    smollm = _golden("tokenizer_smollm2.json")["vocab"]
    im_start = 1
    assert any(im_start in c["ids_no_add_special"] and im_start not in c["ids_no_parse_special"]
               for c in smollm["cases"])
