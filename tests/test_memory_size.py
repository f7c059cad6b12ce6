"""Memory sizes as users type them (--memory, --kv-memory): units, fractions, percentages."""

from __future__ import annotations

import pytest

from hipcore.errors import UsageError
from hipcore.model.memory_plan import parse_memory_size


@pytest.mark.parametrize("text, size", [
    ("0.4GiB", int(0.4 * 2**30)), ("1.5G", 3 * 2**29), ("512", 512), ("512b", 512), ("2.5KiB", 2560),
    ("8 GiB", 8 << 30), ("50%", 500), ("1e3", 1000),
])
def test_sizes_that_mean_something(text, size):
    assert parse_memory_size(text, 1000) == size


@pytest.mark.parametrize("text, words", [
    ("0.4", "fraction of a byte"),   # used to be taken as 0 bytes
    ("0.4b", "fraction of a byte"),
    ("1.5", "add the unit, e.g. 1.5GiB"),
    ("0.0001%", "less than one byte"),
    ("0", "cannot read"), ("-1G", "cannot read"), ("lots", "cannot read"), ("nan", "cannot read"),
])
def test_sizes_that_do_not(text, words):
    with pytest.raises(UsageError, match=words):
        parse_memory_size(text, 1000)
