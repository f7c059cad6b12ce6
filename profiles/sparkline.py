"""A one-line terminal curve: values resampled to `width` cells of the eight block characters."""

from __future__ import annotations

BARS = "▁▂▃▄▅▆▇█"


def sparkline(values, width: int = 32) -> str:
    """The values (None skipped) as at most `width` characters, each cell the mean of its share of the values,
    scaled from the smallest to the largest; a flat series is a flat line."""
    points = [float(v) for v in values if v is not None]
    if not points:
        return ""
    cells = min(width, len(points))
    means = []
    for k in range(cells):
        share = points[k * len(points) // cells:(k + 1) * len(points) // cells]
        means.append(sum(share) / len(share))
    low, high = min(means), max(means)
    if high == low:
        return BARS[0] * cells
    return "".join(BARS[min(len(BARS) - 1, int((m - low) / (high - low) * len(BARS)))] for m in means)
