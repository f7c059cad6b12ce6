"""The bodies of llama-server's /tokenize and /detokenize, and of a model's card (GET /v1/models/{id})."""

from __future__ import annotations

from rocmforge_serve.api_errors import bad_request
from rocmforge_serve.protocol import MAX_PROMPT_IDS


def model_card(served) -> dict:
    return {"id": served.name, "object": "model", "created": served.created, "owned_by": "rocmforge",
            "max_model_len": served.context}


def tokenize_body(served, body: dict) -> dict:
    """{"content": text, "add_special": false, "with_pieces": false} -> {"tokens": [ids]} or, with pieces,
    {"tokens": [{"id", "piece"}]} (a piece that is not whole UTF-8 comes as its byte values, as llama-server's)."""
    content = body.get("content")
    if not isinstance(content, str):
        raise bad_request("content must be a string", param="content", code="invalid_type")
    flags = {}
    for name in ("add_special", "with_pieces", "parse_special"):
        value = body.get(name, name == "parse_special")
        if not isinstance(value, bool):
            raise bad_request(f"{name} must be a boolean", param=name, code="invalid_type")
        flags[name] = value
    tok = served.tokenizer
    ids = tok.encode(content, add_bos=flags["add_special"] and tok.add_bos and tok.bos_id is not None,
                     parse_special=flags["parse_special"], add_eos=False)
    if not flags["with_pieces"]:
        return {"tokens": ids}
    pieces = []
    for token in ids:
        text = tok.piece_text(token)
        pieces.append({"id": token, "piece": text if text is not None else list(tok.token_piece(token))})
    return {"tokens": pieces}


def detokenize_body(served, body: dict) -> dict:
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
        raise bad_request("tokens must be an array of token ids", param="tokens", code="invalid_type")
    if len(tokens) > MAX_PROMPT_IDS:
        raise bad_request(f"tokens has {len(tokens)} ids; at most {MAX_PROMPT_IDS}", param="tokens")
    vocab = served.tokenizer.vocab_size
    if any(t < 0 or t >= vocab for t in tokens):
        raise bad_request(f"token ids must be in [0, {vocab})", param="tokens")
    return {"content": served.tokenizer.decode(tokens)}
