"""A MemoryTimeline drawn with matplotlib: the curves, the requests' lifetimes, the phase and verdict markers.

One figure serves `--plot FILE.png|.svg` and `--report FILE.html` (its SVG inlined, text kept as text so
that the series names are searchable in the page). matplotlib rather than plotly or bokeh: the HTML needs
no JavaScript (plotly inlines 4.8 MB of it in every file, bokeh 1.3 MB and wants pandas), and the same
figure writes PNG and SVG, which pygal does only through cairosvg and a system cairo.
"""

from __future__ import annotations

import io
from pathlib import Path

from hipcore.errors import UsageError
from profiles.memory_timeline import SERIES_LABELS, MemoryTimeline

PLOT_SUFFIXES = (".png", ".svg")
MIB = float(1 << 20)
HELD_COLOR = "#d62728"
OPEN_COLOR = "#ff7f0e"
ENDED_COLOR = "#4c72b0"
VERDICT_COLOR = "#d62728"
MAX_GANTT_ROWS = 400  # rows drawn: the held and open spans always, then the latest of the others


def check_plot_path(path: str | None) -> None:
    if path is not None and Path(path).suffix.lower() not in PLOT_SUFFIXES:
        raise UsageError(f"--plot {path}: the file must end in .png or .svg")


def _pyplot():
    import matplotlib  # imported here: most commands never draw, and it costs ~0.3 s to import
    matplotlib.use("Agg")
    matplotlib.rcParams["svg.fonttype"] = "none"  # text stays text in the SVG
    import matplotlib.pyplot as plt
    return plt


def _values(timeline: MemoryTimeline, name: str, scale: float = 1.0):
    t = timeline.series("t")
    return [(x, v / scale) for x, v in zip(t, timeline.series(name)) if v is not None]


def _line(ax, timeline: MemoryTimeline, name: str, scale: float = 1.0, **style) -> bool:
    points = _values(timeline, name, scale)
    if not points:
        return False
    xs, ys = zip(*points)
    ax.plot(xs, ys, label=SERIES_LABELS[name], linewidth=1.2, **style)
    return True


def _markers(ax, timeline: MemoryTimeline, label: bool) -> None:
    named: set[str] = set()  # the first verdict marker of each layer is labelled
    for m in timeline.markers:
        if m.kind == "phase":
            ax.axvline(m.t, color="0.6", linestyle=":", linewidth=0.8)
            if label:
                ax.annotate(f"{m.text} ({m.requests:,} req)", (m.t, 1.0), xycoords=("data", "axes fraction"),
                            rotation=90, va="top", ha="right", fontsize=7, color="0.35")
        else:
            ax.axvline(m.t, color=VERDICT_COLOR, linewidth=1.6)
            if label and m.layer not in named:
                named.add(m.layer)
                ax.annotate(f"leak: {m.layer}", (m.t, 0.5), xycoords=("data", "axes fraction"), rotation=90,
                            xytext=(2 + 11 * (len(named) - 1), 0), textcoords="offset points",
                            va="center", ha="left", fontsize=8, color=VERDICT_COLOR, weight="bold")


def _gantt(ax, timeline: MemoryTimeline) -> None:
    spans = timeline.spans()
    marked = [s for s in spans if s.held or s.end is None]
    others = [s for s in spans if not (s.held or s.end is None)]
    rows = sorted(marked + others[-max(0, MAX_GANTT_ROWS - len(marked)):], key=lambda s: (s.start, s.request_id))
    end_of_run = max([timeline.now()] + [s.end or 0 for s in spans])
    for kind, color, pick in (("released", ENDED_COLOR, lambda s: not s.held and s.end is not None),
                              ("never ended", OPEN_COLOR, lambda s: not s.held and s.end is None),
                              ("blocks never released", HELD_COLOR, lambda s: s.held)):
        chosen = [(i, s) for i, s in enumerate(rows) if pick(s)]
        if not chosen:
            continue
        # A held span runs to the end of the run: its blocks never came back.
        ax.hlines([i for i, _ in chosen], [s.start for _, s in chosen],
                  [end_of_run if s.held or s.end is None else s.end for _, s in chosen],
                  colors=color, linewidth=2.5 if len(rows) < 150 else 1.2, label=f"requests: {kind}")
    ax.set_ylim(len(rows), -1)
    ax.set_ylabel("requests" + (f" (latest {len(rows)} of {len(spans) + timeline.dropped_spans})"
                                if len(rows) < len(spans) + timeline.dropped_spans else ""))
    ax.set_yticks([])


def figure(timeline: MemoryTimeline):
    """The figure: KV blocks, ledger bytes by tag, host and driver memory, fragmentation, request lifetimes."""
    plt = _pyplot()
    has_driver = any(v is not None for v in timeline.series("driver_free"))
    panels = 5 if has_driver else 4
    fig, axes = plt.subplots(panels, 1, figsize=(11, 2.3 * panels + 1.6), sharex=True,
                             gridspec_kw={"height_ratios": [1] * (panels - 1) + [1.6]})
    kv, ledger, host = axes[0], axes[1], axes[2]
    for name in ("kv_used", "kv_cached", "kv_free"):
        _line(kv, timeline, name)
    kv.set_ylabel("KV blocks")
    frag = kv.twinx()
    _line(frag, timeline, "fragmentation", color="0.5", linestyle="--")
    frag.set_ylim(0, 1)
    frag.set_ylabel("fragmentation")
    for name in [n for n in timeline.present() if n.startswith("ledger_")]:
        if any(timeline.series(name)):  # a tag that never held a byte is left out
            _line(ledger, timeline, name, MIB)
    ledger.set_ylabel("ledger MiB")
    _line(host, timeline, "rss", MIB, color="#2ca02c")
    host.set_ylabel("host MiB")
    if has_driver:
        _line(axes[3], timeline, "driver_free", MIB, color="#9467bd")
        axes[3].set_ylabel("driver free MiB")
    _gantt(axes[-1], timeline)
    axes[-1].set_xlabel("seconds")
    for k, ax in enumerate(axes):
        _markers(ax, timeline, label=k in (0, len(axes) - 1))
        handles, labels = ax.get_legend_handles_labels()
        if ax is kv:
            more = frag.get_legend_handles_labels()
            handles, labels = handles + more[0], labels + more[1]
        if handles:
            ax.legend(handles, labels, loc="upper left", fontsize=7, framealpha=0.8, ncol=min(4, len(handles)))
        ax.grid(True, alpha=0.25)
    verdict = f" - verdict: {timeline.verdict}" if timeline.verdict else ""
    fig.suptitle(f"{timeline.title}{verdict}", fontsize=10)
    fig.tight_layout()
    return fig


def render(timeline: MemoryTimeline, fmt: str) -> bytes:
    """The figure as PNG or SVG bytes."""
    plt = _pyplot()
    fig = figure(timeline)
    buffer = io.BytesIO()
    try:
        fig.savefig(buffer, format=fmt, dpi=110, metadata={"Date": None} if fmt == "svg" else None)
    finally:
        plt.close(fig)
    return buffer.getvalue()


def write_plot(timeline: MemoryTimeline, path: str) -> None:
    check_plot_path(path)
    Path(path).write_bytes(render(timeline, Path(path).suffix.lower()[1:]))
