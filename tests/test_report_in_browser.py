"""The --report page rendered by headless Chromium (the full tier, tests/support/tiers.py: it needs the `chromium`
package): the screenshot is not blank and the series names are in the rendered page's text."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np

from profiles.report_html import build_html
from test_memory_timeline import leaky_timeline


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    assert found, "the full tier needs Chromium: apt-get install chromium"
    return found


def headless(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", *args],
                          capture_output=True, text=True, timeout=120)


def test_chromium_draws_the_report_and_its_series(tmp_path):
    from PIL import Image
    page = tmp_path / "report.html"
    page.write_text(build_html(leaky_timeline()))
    shot = tmp_path / "shot.png"
    headless(f"--screenshot={shot}", "--window-size=1200,1600", page.as_uri())
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=np.float32)
    assert pixels.std() > 10 and (pixels < 128).mean() > 0.01  # drawn, not a blank page
    red = np.asarray(Image.open(shot).convert("RGB"), dtype=np.int16)
    assert ((red[..., 0] > 180) & (red[..., 1] < 80) & (red[..., 2] < 80)).sum() > 200  # the held spans and verdict
    text = headless("--dump-dom", page.as_uri()).stdout
    for label in ("KV blocks used", "ledger kv", "host memory (RSS)", "requests: blocks never released",
                  "verdict: leak"):
        assert label in text, label
