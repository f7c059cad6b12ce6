"""Rich tables for profile-kv: a model's shape, the capacity table, the plan, and MemoryProfiles.

Exact byte counts are printed where a reader will check them by hand (bytes per token and per
block); large sizes are printed in binary units. Cells fold instead of being cut short, so a narrow
terminal never hides a digit. JSON output (`to_dict()` of each result) carries exact integers.
"""

from __future__ import annotations

import re

from rich import box
from rich.table import Table

from hipcore.kvcache import MemoryProfile
from hipcore.runtime.ledger import format_bytes
from profiles.breakable_text import BETWEEN_WORDS, FIGURE_PAIR, PATH, BreakableText, TableNote
from profiles.kv_capacity import CapacityTable, KvPlan, bytes_per_token
from profiles.kv_workloads import WorkloadReport, WorkloadResult
from profiles.presets import ModelShape


def _int(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def _bytes(n: int | None) -> str:
    return "-" if n is None else format_bytes(n)


class _WholeNumbersTable(Table):
    """A table whose numbers are never broken across lines: each number column is at least as wide as the
    widest part of its cells, a part being what lies between ' / ' and before ' (' ("272.0 MiB /", "528 tokens"),
    so that a cell of two figures may take two lines at 80 columns but no number is cut (its header and the text
    columns wrap too)."""

    def add_row(self, *cells, **kwargs) -> None:
        cells = [BreakableText(cell, FIGURE_PAIR if column.justify == "right" else BETWEEN_WORDS)
                 if isinstance(cell, str) else cell for column, cell in zip(self.columns, cells)]
        super().add_row(*cells, **kwargs)
        for column, cell in zip(self.columns, cells):
            if isinstance(cell, BreakableText) and column.justify == "right":
                parts = re.split(r"(?<= /) | (?=\()", cell.text)
                column.min_width = max(column.min_width or 0, *(len(part) for part in parts))

    def __rich_console__(self, console, options):
        # a caption, as the title, wraps between words and never between a number and its unit
        if isinstance(self.caption, str):
            self.caption = TableNote(self.caption, style="table.caption")
        yield from super().__rich_console__(console, options)


def _table(title: str, columns: list[str], *, header: bool = True, text_columns: tuple[str, ...] = (),
           word_a_line_headers: bool = True) -> Table:
    """Columns named in text_columns (and the first) are left-aligned; the rest are numbers."""
    # Lines under the header only, no column borders: the 9 characters they take let a table of 8 number
    # columns keep every number whole at 80 columns.
    t = _WholeNumbersTable(title=TableNote(title), title_justify="left", show_header=header, box=box.SIMPLE_HEAD,
                           show_edge=False, collapse_padding=True)
    for i, name in enumerate(columns):
        left = i == 0 or name in text_columns
        # A number column's header takes one word a line, so the column is only as wide as its numbers.
        t.add_column(name if left or not word_a_line_headers else name.replace(" ", "\n"), justify="left" if left else "right", overflow="fold",
                     style="bold" if i == 0 and not header else None)
    return t


def model_table(shape: ModelShape) -> Table:
    t = _table(f"Model: {shape.name}", ["field", "value"], header=False, text_columns=("value",))
    t.add_row("source", BreakableText(shape.source, PATH))
    t.add_row("layers", _int(shape.n_layers))
    t.add_row("heads (query / KV)", f"{shape.n_heads} / {shape.n_kv_heads}")
    t.add_row("head dim", _int(shape.head_dim))
    t.add_row("hidden / ffn", f"{shape.hidden_size:,} / {shape.ffn_size:,}")
    t.add_row("vocabulary", _int(shape.vocab_size))
    t.add_row("context length", _int(shape.context_length))
    if shape.layer_windows:
        local = sum(1 for w in shape.layer_windows if w)
        t.add_row("attention layers", f"{shape.n_layers - local} global, {local} sliding-window "
                                      f"(window {max(shape.layer_windows):,} tokens)")
    t.add_row("parameters", _int(shape.n_params))
    if shape.is_moe:
        t.add_row("experts", f"{shape.n_experts_used} of {shape.n_experts} a token, {shape.expert_ffn_size:,} wide")
        t.add_row("active parameters", f"{_int(shape.n_active_params)} a token (the embedding table aside)")
    if shape.weight_bytes is not None:
        t.add_row("weights in the file", f"{format_bytes(shape.weight_bytes)} ({shape.weight_bytes:,} B, {shape.weight_type})")
    return t


def presets_table(shapes: list[ModelShape]) -> Table:
    t = _table("Model presets (--preset NAME)",
               ["preset", "layers", "heads", "KV heads", "head dim", "context", "parameters", "f16 KV B/token"])
    for s in shapes:
        t.add_row(s.name, _int(s.n_layers), _int(s.n_heads), _int(s.n_kv_heads), _int(s.head_dim),
                  _int(s.context_length), _int(s.n_params), _int(bytes_per_token(s, "f16")))
    return t


def capacity_table(table: CapacityTable) -> Table:
    source = f", {table.memory_source}" if table.memory_source else ""
    notes = any(r.note for r in table.rows)
    t = _table(f"KV capacity of {format_bytes(table.memory)} ({table.memory:,} B{source}); block 0 is reserved",
               ["dtype", "block", "B/token", "B/block", "blocks", "tokens", f"seqs of {table.context:,}",
                "mean waste/seq"] + (["note"] if notes else []), text_columns=("note",))
    for r in table.rows:
        t.add_row(r.dtype, _int(r.block_size), _int(r.bytes_per_token), _int(r.bytes_per_block), _int(r.usable_blocks),
                  _int(r.tokens), _int(r.context_sequences), _bytes(r.mean_last_block_waste), *([r.note] if notes else []))
    t.caption = "mean waste/seq: unused bytes of a last block, on average (block - 1) / 2 slots"
    if table.model.layer_windows:
        t.caption += ("\nsliding-window model: B/token is a token inside the window (every layer);\n"
                      "B/block and blocks are the global pool's; seqs are window-true (see below)")
        if all(table.model.layer_windows):
            t.caption += ("\nevery layer slides: the global pool holds no layer (B/block 0, its blocks count\n"
                          "positions only); the local pool below is the whole cache")
    t.caption_justify = "left"
    return t


def window_groups_table(shape: ModelShape, rows, seq_len: int) -> Table:
    """Per-group figures of a model with sliding-window layers, one row per capacity or plan row."""
    local = sum(1 for w in shape.layer_windows if w)
    t = _table(f"Window-true: {shape.n_layers - local} global layers, {local} sliding (window "
               f"{max(shape.layer_windows):,})",
               ["dtype", "block", "global B/token", "local B/token", f"B/token at {seq_len:,}", "local blocks"])
    for r in rows:
        t.add_row(r.dtype, _int(getattr(r, "block_size", None)), _int(r.global_bytes_per_token),
                  _int(r.local_bytes_per_token), _int(r.window_true_bytes_per_token), _int(r.local_blocks))
    t.caption = (f"B/token at {seq_len:,}: device bytes per token of a sequence that long\n"
                 "(its global blocks + a window of local blocks); local blocks:\n"
                 "the sliding-window pool, sized for the sequences that fit")
    t.caption_justify = "left"
    return t


def plan_tables(plan: KvPlan) -> list[Table]:
    budget = _table(f"Plan for {format_bytes(plan.memory)} of device memory", ["part", "size", "bytes", "how"],
                    header=False, text_columns=("how",))
    budget.add_row("device memory", format_bytes(plan.memory), _int(plan.memory), "")
    budget.add_row("- weights", format_bytes(plan.weights), _int(plan.weights), plan.weights_source)
    budget.add_row("- activations", format_bytes(plan.activations), _int(plan.activations),
                   f"estimate: runner buffers for {plan.max_step_tokens:,} tokens/step, {plan.max_seqs} sequences")
    budget.add_row("- margin", format_bytes(plan.margin), _int(plan.margin), "kept free for the driver")
    budget.add_row("= KV budget", format_bytes(plan.kv_budget), _int(plan.kv_budget),
                   "" if plan.kv_budget > 0 else "nothing left for the KV cache")
    notes = any(r.note for r in plan.rows)
    rows = _table(f"What fits: sequences of {plan.seq_len:,} tokens (context {plan.context:,}), blocks of {plan.block_size}",
                  ["dtype", "B/token", "KV pool", "blocks", "tokens", "blocks/seq", "sequences"]
                  + (["note"] if notes else []), text_columns=("note",))
    for r in plan.rows:
        rows.add_row(r.dtype, _int(r.bytes_per_token), _bytes(r.kv_bytes), _int(r.usable_blocks), _int(r.tokens),
                     _int(r.blocks_per_sequence), _int(r.sequences), *([r.note] if notes else []))
    if not plan.model.layer_windows:
        return [budget, rows]
    return [budget, rows, window_groups_table(plan.model, plan.rows, plan.seq_len)]


def memory_profile_table(profile: MemoryProfile, title: str = "KV cache memory profile") -> Table:
    """One MemoryProfile as a table (what engine workloads print after each run)."""
    p = profile
    t = _table(title, ["figure", "value", "detail"], header=False, text_columns=("detail",))
    t.add_row("KV dtype / block size", f"{p.dtype} / {p.block_size}", f"{p.n_layers} layers x {p.n_kv_heads} KV heads x {p.head_dim}")
    t.add_row("bytes per token", _int(p.bytes_per_token), "K + V, all layers")
    t.add_row("pool bytes", format_bytes(p.pool_bytes_total),
              f"used {format_bytes(p.pool_bytes_used)}, free {format_bytes(p.pool_bytes_free)}, "
              f"pending {format_bytes(p.pool_bytes_pending)}, null block {format_bytes(p.pool_bytes_reserved)}")
    t.add_row("blocks", _int(p.total_blocks),
              f"physical {p.physical_blocks:,}, logical {p.logical_blocks:,}, free {p.free_blocks:,}, pending {p.pending_blocks:,}")
    t.add_row("sequences / tokens", f"{p.active_sequences:,} / {p.total_tokens:,}", "")
    t.add_row("fragmentation", f"{p.fragmentation_ratio:.1%}",
              f"{p.allocated_slots - p.used_slots:,} of {p.allocated_slots:,} slots unused ({format_bytes(p.wasted_bytes)})")
    t.add_row("sharing", _int(p.shared_blocks), f"shared blocks; {format_bytes(p.sharing_saved_bytes)} saved")
    if p.prefix_caching:
        t.add_row("prefix cache", _int(p.cached_blocks),
                  f"cached blocks ({format_bytes(p.pool_bytes_cached)}): no sequence holds them, evicted when needed; "
                  f"hit rate {p.prefix_hit_rate:.1%} ({p.prefix_hit_tokens:,} of {p.prefix_query_tokens:,} prompt tokens)")
    t.add_row("capacity", _int(p.capacity_tokens), "tokens that still fit ((free + cached) blocks x block size)")
    t.add_row("page tables", format_bytes(p.page_table_bytes), "int32 per table entry")
    t.add_row("allocator", format_bytes(p.allocator_bytes), "free list, pending list, reference counts, sequences")
    if len(p.groups) > 1:
        for g in p.groups:
            what = f"{g.layers} layers" + (f", window {g.window:,}" if g.window else ", every position")
            t.add_row(f"{g.name} group", f"{g.bytes_per_token:,} B/token",
                      f"{what}: {g.physical_blocks:,} of {g.total_blocks:,} blocks held, {g.free_blocks:,} free, "
                      f"{g.pending_blocks:,} pending, {g.released_blocks:,} released out of the window; "
                      f"{format_bytes(g.pool_bytes_used)} of {format_bytes(g.pool_bytes_total)}")
    return t


def workloads_header(report: WorkloadReport) -> Table:
    t = _table(f"KV workloads on {report.model.name}", ["", "value"], header=False, text_columns=("value",))
    t.add_row("mode", report.mode_note)
    t.add_row("device", report.device)
    t.add_row("KV cache", f"{report.kv_dtype}, blocks of {report.block_size} tokens, {report.usable_blocks:,} usable blocks "
                          f"({format_bytes(report.pool_bytes)} with the null block)")
    t.add_row("engine", f"{report.max_step_tokens:,} tokens per step, up to {report.max_seqs} sequences")
    t.add_row("time", f"{report.seconds:.1f} s")
    return t


def workload_table(result: WorkloadResult) -> Table:
    """One column per snapshot of the workload, one row per MemoryProfile figure."""
    t = _table(f"{result.name}: {result.description}", ["figure"] + [s.label for s in result.snapshots],
               word_a_line_headers=False)  # snapshot labels read as phrases
    profiles = [s.profile for s in result.snapshots]

    def row(name: str, cell) -> None:
        t.add_row(name, *(cell(p) for p in profiles))

    row("sequences / tokens", lambda p: f"{p.active_sequences:,} / {p.total_tokens:,}")
    row("blocks physical / logical", lambda p: f"{p.physical_blocks:,} / {p.logical_blocks:,}")
    row("pool used", lambda p: format_bytes(p.pool_bytes_used))
    row("used per token", lambda p: format_bytes(p.pool_bytes_used // p.total_tokens) if p.total_tokens else "-")
    row("fragmentation", lambda p: f"{p.fragmentation_ratio:.1%} ({p.allocated_slots - p.used_slots:,} slots)")
    row("wasted", lambda p: format_bytes(p.wasted_bytes))
    row("shared blocks", lambda p: _int(p.shared_blocks))
    row("saved by sharing", lambda p: format_bytes(p.sharing_saved_bytes))
    row("page tables", lambda p: f"{p.page_table_bytes:,} B")
    row("allocator", lambda p: f"{p.allocator_bytes:,} B")
    if any(p.prefix_caching for p in profiles):
        row("cached blocks", lambda p: f"{p.cached_blocks:,} ({format_bytes(p.pool_bytes_cached)})")
        row("prefix hit rate", lambda p: f"{p.prefix_hit_rate:.1%} of {p.prefix_query_tokens:,}")
    row("free / capacity", lambda p: f"{format_bytes(p.pool_bytes_free)} / {p.capacity_tokens:,} tokens")
    lines = ["cache quiescent after the workload: " + ("yes (every block back, every count 0)" if result.quiescent_after else "NO")]
    lines += list(result.notes)
    t.caption = "\n".join(lines)
    t.caption_justify = "left"
    return t
