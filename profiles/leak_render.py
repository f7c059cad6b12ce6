"""Rich tables of a LeakReport: verdict, layers, phases, requests by ending, and what leaked."""

from __future__ import annotations

from rich import box
from rich.console import Group
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

from hipcore.runtime.ledger import format_bytes
from profiles.breakable_text import FIGURE_PAIR, PATH, BreakableText, ShellCommandText, TableNote
from profiles.leak_report import LEAK, MIN_HOST_SPAN, NOT_JUDGED, LeakReport
from profiles.sparkline import sparkline

ITEMS_SHOWN = 20
LAYER_NAME = r"(?<= )|(?<=\+)"  # 'host (RssAnon+VmSwap)' may take three lines, none of them part of a word
FIRST_COLUMN_WORD = 13  # the longest word kept whole in a first column ("(tracemalloc)"); longer ones fold


def _table(title: str, columns: list[str], text_columns: tuple[str, ...] = ()) -> Table:
    # Light rules and no outer padding: the room goes to the figures (80 columns hold every table).
    # Two spaces between columns (the rule's and one of padding), none at the edges.
    t = Table(title=TableNote(title), title_justify="left", box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False,
              padding=(0, 0, 0, 1))
    for i, name in enumerate(columns):
        t.add_column(name, justify="left" if i == 0 or name in text_columns else "right", overflow="fold")
    return t


def _b(n: int | None) -> str:
    return "-" if n is None else f"{format_bytes(n)}" if abs(n) >= 1024 else f"{n} B"


def verdict_text(report: LeakReport) -> Text:
    if report.interrupted:
        return Text(f"INTERRUPTED, NO VERDICT: a partial report of what was read before Ctrl-C (exit {report.exit_code}); "
                    "the findings below are not a verdict", style="bold yellow")
    if report.leaked:
        return Text(f"LEAK: {sum(f.severity == LEAK for f in report.findings)} findings (exit 1)", style="bold red")
    if report.not_judged:
        layers = ", ".join(sorted({f.layer for f in report.not_judged}))
        return Text(f"NOT JUDGED: nothing leaked in what was checked, but {layers} could not be judged (exit 1)",
                    style="bold yellow")
    warnings = sum(f.severity == "warning" for f in report.findings)
    return Text("CLEAN: every block and every device byte came back" + (f" ({warnings} warnings)" if warnings else ""),
                style="bold green")


def layers_table(report: LeakReport) -> Table:
    t = _table("Not returned, per layer (against the baseline taken after warm-up)",
               ["layer", "not returned", "in", "per request", "baseline", "peak", "final"])
    for row in report.layer_totals():
        unit = {"allocations": "allocs"}.get(row["unit"], row["unit"])
        count = "-" if row["count"] is None else f"{row['count']:,} {unit}"
        per = "-" if row["per_request"] is None else _b(round(row["per_request"]))
        # Compact figures keep the table within 80 columns; --json and the findings give exact bytes.
        t.add_row(BreakableText(row["layer"], LAYER_NAME), _b(row["bytes"]), count, per, _b(row["baseline"]),
                  _b(row["peak"]), _b(row["final"]))
    return t


def host_growth_table(report: LeakReport) -> Table:
    t = _table("Host growth per 1000 requests (least-squares slope)", ["measure", "per 1000 req", "fit over", "judged"],
               text_columns=("judged",))
    h = report.host
    for name, fit in (("whole run", h.whole), ("second half", h.judged)):
        for label, slope in (("RSS", fit.rss_slope), ("tracemalloc", fit.traced_slope)):
            per = fit.per_1000(slope)
            if per is not None:
                judged = ("shown" if fit is h.whole else "yes" if fit.span >= MIN_HOST_SPAN
                          else f"no (< {MIN_HOST_SPAN} req)")
                t.add_row(f"{label}, {name}", _b(per), f"{fit.span:,} req", judged)
    return t


def phases_table(report: LeakReport) -> Table:
    t = _table("After each phase", ["phase", "requests", "seconds", "engine state", "KV blocks cached (evicted)",
                                   "KV blocks not free", "ledger growth / driver loss", "records"],
               text_columns=("engine state",))
    for p in report.phases:
        e = p.engine
        state = "empty" if e.empty else f"{e.active_requests} active, {e.cache_sequences} tables"
        blocks = "-" if p.blocks is None else f"{p.blocks.not_free:,}"
        cached = "-" if p.blocks is None else f"{p.blocks.cached:,}"
        growth = p.ledger.leaked_bytes
        name = p.name + ("" if p.ledger_judged else " (ledger not judged)") + (
            " (KV invariant broken)" if p.blocks is not None and p.blocks.invariant_error else "")
        # compact as the layers' table (exact below 1 KiB): 80 columns hold it; --json and the findings give bytes
        t.add_row(name, f"{p.requests:,}", f"{p.seconds:.1f}", state, cached, blocks,
                  BreakableText(f"{_b(growth)} / {_b(p.driver_loss)}", FIGURE_PAIR), f"{e.finished_records}/{e.finished_bound}")
    return t


def requests_table(report: LeakReport) -> Table:
    r = report.requests
    t = _table(f"Requests: {r.get('total', 0):,} measured (+{r.get('warmup', 0)} warm-up)", ["ending", "requests"])
    for ending, n in sorted(r.get("by_ending", {}).items(), key=lambda kv: -kv[1]):
        t.add_row(ending, f"{n:,}")
    for phase, n in sorted(r.get("cancelled_by_phase", {}).items()):
        t.add_row(f"  cancelled while {phase}", f"{n:,}")
    inj = r.get("injected", {})
    t.add_row("  failed by an injected sampler fault", f"{inj.get('fail_sampling', 0):,}")
    t.add_row("  forward passes failed on purpose", f"{inj.get('fail_step', 0):,}")
    t.add_row("  failed with such a batch (collateral)", f"{r.get('collateral_failures', 0):,}")
    t.add_row("  cancels that raced the final step", f"{inj.get('final_step_cancels', 0):,}")
    t.add_row("parallel-sample requests (n > 1)", f"{r.get('parallel_sample_requests', 0):,}")
    t.add_row("requests preempted (preemptions)", f"{r.get('preempted_requests', 0):,} ({r.get('preemptions', 0):,})")
    if "prefix_query_tokens" in r:  # the run's prefix cache (warm-up included), as serve's /metrics counts it
        t.add_row("prompt tokens found in the prefix cache", f"{r['prefix_hit_tokens']:,} of {r['prefix_query_tokens']:,}")
    t.add_row("ended other than planned", f"{r.get('unexpected', 0):,}")
    t.add_row("dropped by the final shutdown", f"{r.get('shutdown_tail', {}).get('dropped', 0):,}")
    return t


def leaks_table(report: LeakReport) -> Table | None:
    """Each leaked block or allocation with its owner and where it was allocated (first ITEMS_SHOWN),
    listed once: under the first phase after which it was seen."""
    rows = []
    seen: set[tuple] = set()

    def add(key: tuple, row: tuple) -> None:
        if key not in seen:
            seen.add(key)
            rows.append(row)

    for p in report.phases:
        if p.blocks is not None:
            for item in p.blocks.leaked:
                owner = item["owners"][0] if item["owners"] else None
                who = (f"request {owner['request_id']} ({owner['plan']}), ended {owner['ending']} in {owner['phase_at_end']}, "
                       f"{owner['run_phase']}") if owner else "no block table holds it"
                local = "" if item.get("group", "global") == "global" else f"{item['group']} "  # sliding-window pool
                add(("block", item.get("group"), item["block"], item["refcount"], tuple(item["sequences"])),
                    (p.name, f"KV {local}block {item['block']} (refcount {item['refcount']})", who, "-"))
        if p.ledger_judged:
            for a in p.ledger.not_returned:
                add(("allocation", a["serial"]), (p.name, f"{a['tag']} {a['bytes']:,} B {a['label']}", a["owner"], a["site"]))
    if report.close_ledger is not None:
        for a in report.close_ledger.not_returned:
            add(("allocation", a["serial"]), ("after close", f"{a['tag']} {a['bytes']:,} B {a['label']}", a["owner"], a["site"]))
    if not rows:
        return None
    t = _table(f"Not returned ({len(rows):,}; first {min(len(rows), ITEMS_SHOWN)})", ["seen", "what", "owner", "allocated at"],
               text_columns=("what", "owner", "allocated at"))
    for seen_in, what, owner, site in rows[:ITEMS_SHOWN]:
        t.add_row(seen_in, what, owner, BreakableText(site, PATH))  # a source path folds after a '/'
    return t


def curves_text(report: LeakReport) -> Text | None:
    """KV blocks in use and host memory over the whole run, as two terminal sparklines (--plot draws them)."""
    timeline = report.timeline
    if timeline is None or not timeline.series("t"):
        return None
    lines = Text()
    used = [v for v in timeline.series("kv_used") if v is not None]
    rss = [v for v in timeline.series("rss") if v is not None]
    if used:
        lines.append(f"{'KV blocks in use':<17} ").append(sparkline(used), style="cyan")
        lines.append(f" {used[0]:,} -> {used[-1]:,} (peak {max(used):,})\n")
    if rss:
        lines.append(f"{'host memory (RSS)':<17} ").append(sparkline(rss), style="green")
        lines.append(f" {_b(rss[0])} -> {_b(rss[-1])}\n")
    return lines if lines.plain else None


class FiguresFirst:
    """A table whose figure columns keep their width on a narrow terminal: the text columns wrap instead. (Rich
    shrinks every column alike when a table is too wide, then widens each back to its minimum, past the edge.)"""

    def __init__(self, table: Table):
        self.table = table

    def __rich_measure__(self, console, options) -> Measurement:
        return Measurement.get(console, options, self.table)

    def __rich_console__(self, console, options):
        figures = [c for c in self.table.columns if c.justify == "right"]
        narrow = self.table.__rich_measure__(console, options).maximum > options.max_width
        for column in figures if narrow else ():
            column.width = column.min_width
        try:
            yield self.table
        finally:
            for column in figures if narrow else ():
                column.width = None


def keep_figures_whole(table: Table) -> FiguresFirst:
    """Give each figure column (right-aligned) the width of its widest cell, so that a narrow
    terminal wraps the text columns and never breaks a number from its unit or itself; the first
    column is at least its longest word wide, so names wrap between words only."""
    for k, column in enumerate(table.columns):
        if k == 0 and column.justify == "left":
            words = [len(w) for c in column._cells for w in (c.plain if isinstance(c, Text) else str(c)).split()]
            column.min_width = min(FIRST_COLUMN_WORD, max(words, default=0))
        elif column.justify == "right":
            cells = [Text.from_markup(c).cell_len if isinstance(c, str) else
                     c.widest_piece() if isinstance(c, BreakableText) else c.cell_len for c in column._cells]
            words = [len(w) for w in str(column.header).split()]  # a header wraps between its words only
            column.min_width = max(cells + words, default=0)
    return FiguresFirst(table)


def findings_table(report: LeakReport) -> Table | None:
    if not report.findings:
        return None
    t = _table("Findings", ["layer", "severity", "what"], text_columns=("severity", "what"))
    for f in report.findings:
        style = "red" if f.severity == LEAK else "bold yellow" if f.severity == NOT_JUDGED else "yellow"
        t.add_row(f.layer, Text(f.severity, style=style), BreakableText(f.message))
    return t


def render(report: LeakReport) -> Group:
    parts = [verdict_text(report), *filter(None, [curves_text(report)]), layers_table(report), host_growth_table(report),
             phases_table(report), requests_table(report)]
    for extra in (leaks_table(report), findings_table(report)):
        if extra is not None:
            parts.append(extra)
    parts = [keep_figures_whole(p) if isinstance(p, Table) else p for p in parts]
    if report.host.tracemalloc_top and report.leaked:
        t = _table("Host: tracemalloc's largest growth since the baseline", ["where", "bytes", "allocations"])
        for line in report.host.tracemalloc_top:
            t.add_row(BreakableText(line["where"], PATH), f"{line['bytes']:,}", f"{line['allocations']:,}")
        parts.append(t)
    parts.append(BreakableText(f"{report.device}; {report.requests.get('total', 0):,} requests in {report.wall_seconds:.1f} s "
                      f"(model load {report.load_seconds:.1f} s)"))
    parts.append(ShellCommandText("reproduce: ", report.command, style="dim"))
    return Group(*parts)
