"""Log-probabilities in OpenAI's shapes: chat's {"content": [{token, logprob, bytes, top_logprobs}]} and the
completions' {tokens, token_logprobs, top_logprobs, text_offset}, from the engine's events (Event.logprobs)."""

from __future__ import annotations


def _token(tokenizer, token_id: int) -> tuple[str, list[int]]:
    """The token as text and bytes; a piece that is not whole UTF-8 (part of a character) is written
    "bytes:\\xNN..." as OpenAI writes such tokens, so that two of them never read alike."""
    piece = tokenizer.token_piece(token_id)
    try:
        text = piece.decode("utf-8")
    except UnicodeDecodeError:
        text = "bytes:" + "".join(f"\\x{b:02x}" for b in piece)
    return text, list(piece)


def chat_entry(tokenizer, token_id: int, logprobs: tuple) -> dict:
    chosen, top = logprobs
    text, raw = _token(tokenizer, token_id)
    alternatives = []
    for other, value in top:
        other_text, other_raw = _token(tokenizer, other)
        alternatives.append({"token": other_text, "logprob": value, "bytes": other_raw})
    return {"token": text, "logprob": chosen, "bytes": raw, "top_logprobs": alternatives}


def chat_logprobs(tokenizer, tokens: list[tuple[int, tuple]]) -> dict:
    return {"content": [chat_entry(tokenizer, token_id, logprobs) for token_id, logprobs in tokens]}


def completion_logprobs(tokenizer, tokens: list[tuple[int, tuple]], offset: int = 0) -> dict:
    """offset: the characters of the completion before these tokens (text_offset counts from the completion's
    start, as OpenAI's does without echo)."""
    out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for token_id, (chosen, top) in tokens:
        text, _ = _token(tokenizer, token_id)
        out["tokens"].append(text)
        out["token_logprobs"].append(chosen)
        out["top_logprobs"].append({_token(tokenizer, other)[0]: value for other, value in top})
        out["text_offset"].append(offset)
        offset += len(text)
    return out


def event_logprobs(event) -> list[tuple[int, tuple]]:
    """The (token id, logprobs) pairs of one event (none for an end-of-generation token's)."""
    if event.logprobs is None or not event.token_ids:
        return []
    return [(event.token_ids[0], event.logprobs)]
