"""`rocmforge bench --prefix-reuse`: the multi-turn chat load with and without the prefix cache (profiles/bench_prefix.py),
in a table of its own."""

from __future__ import annotations

import json
from pathlib import Path

from hipcore.engine.loader import LoadOptions, load_model
from profiles.bench import _NoEndTokenizer, source_commit
from profiles.bench_prefix import CPU_CHAT, GPU_CHAT, ChatLoad, run_prefix_reuse
from rocmforge_cli.markdown_out import print_markdown


def prefix_reuse_command(path: str, dev, *, kv_dtype: str, output: str, quiet: bool, conversations: int | None,
                         turns: int | None, turn_tokens: int | None, reply_tokens: int | None, say) -> None:
    defaults = CPU_CHAT if dev.backend == "cpu" else GPU_CHAT
    pick = lambda given, key: defaults[key] if given is None else given  # noqa: E731
    load = ChatLoad(pick(conversations, "conversations"), pick(turns, "turns"), pick(turn_tokens, "turn_tokens"),
                    pick(reply_tokens, "reply_tokens"))
    load.validate()
    options = LoadOptions(device="auto", ctx_size=load.context, max_seqs=load.conversations, max_step_tokens=2048,
                          kv_dtype=kv_dtype, prefix_caching=True)
    loaded = load_model(path, options, status=say, device=dev)
    try:
        report = run_prefix_reuse(loaded, load, tokenizer=_NoEndTokenizer(loaded.tokenizer), say=say)
        facts = {"model": Path(path).name, "device": loaded.device.describe(), "kv_dtype": loaded.cache.config.dtype,
                 "block_size": loaded.cache.config.block_size, "commit": source_commit()}
    finally:
        loaded.close()
    if output == "json":
        print(json.dumps({**facts, **report.to_dict()}, indent=2))
        return
    print_markdown("\n".join([f"{facts['model']} on {facts['device']}, KV {facts['kv_dtype']} in blocks of "
                               f"{facts['block_size']}, commit {facts['commit']}", *report.markdown()]))
