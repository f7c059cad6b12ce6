"""profile-kv at 80 columns keeps every number whole, and --plan on a preset says which weight type it
assumes (Q4_K_M by default, --weights-type to choose)."""

from __future__ import annotations

import json
import re

import pytest
from rich.console import Console
from typer.testing import CliRunner

from profiles import render
from profiles.kv_capacity import capacity_table, plan_kv
from profiles.presets import PRESETS
from rocmforge_cli.app import app

NUMBER = re.compile(r"\d[\d,]*(?:\.\d+)?")


def rendered_at_80(table) -> str:
    console = Console(width=80, record=True, file=open("/dev/null", "w"))
    console.print(table)
    return console.export_text()


def cell_numbers(table) -> set[str]:
    numbers = set()
    for column in table.columns:
        for cell in column._cells:
            numbers.update(NUMBER.findall(str(cell)))
    return numbers


def assert_numbers_whole(table) -> None:
    text = rendered_at_80(table)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 80, text
    for number in cell_numbers(table):
        assert any(re.search(rf"(?<![\d,.]){re.escape(number)}(?![\d,])", line) for line in lines), (number, text)


def tables_to_check():
    shapes = list(PRESETS.values())
    yield "presets", render.presets_table(shapes)
    for shape in shapes:
        for memory in (8 << 30, 80 << 30, 1 << 40):
            capacity = capacity_table(shape, memory, memory_source="--memory", dtypes=["f16", "bf16", "f32", "q8_0"],
                                      block_sizes=[8, 16, 32, 64])
            yield f"capacity {shape.name} {memory}", render.capacity_table(capacity)
            if shape.layer_windows:
                yield f"window groups {shape.name} {memory}", render.window_groups_table(shape, capacity.rows,
                                                                                        capacity.context)
            for table in render.plan_tables(plan_kv(shape, memory)):
                yield f"plan {shape.name} {memory}", table


@pytest.mark.parametrize("name, table", list(tables_to_check()), ids=lambda v: v if isinstance(v, str) else "")
def test_no_number_is_broken_across_lines_at_80_columns(name, table):
    assert_numbers_whole(table)


def test_the_readmes_plan_assumes_q4_k_m_and_says_so():
    result = CliRunner().invoke(app, ["profile-kv", "--preset", "Llama-2-70B", "--plan", "--memory", "80GiB", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)["plan"]
    assert "Q4_K_M (4.84 bits/weight" in plan["weights_source"]
    assert plan["weights"] == int(68_976_648_192 * 4.84 / 8)
    f16_kv = next(r for r in plan["rows"] if r["dtype"] == "f16")
    assert f16_kv["sequences"] == 32 and f16_kv["tokens"] > 0  # it used to be all zeros (F16 weights: 128.5 GiB)


@pytest.mark.parametrize("choice, words, fits", [("f16", "as F16 (16 bits/weight)", False),
                                                 ("q8_0", "as Q8_0 (8.5 bits/weight)", True),
                                                 ("Q4_K_M", "as Q4_K_M (4.84", True)])
def test_the_user_chooses_the_weight_type(choice, words, fits):
    result = CliRunner().invoke(app, ["profile-kv", "--preset", "Llama-2-70B", "--plan", "--memory", "80GiB",
                                      "--weights-type", choice, "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)["plan"]
    assert words in plan["weights_source"]
    assert (plan["rows"][0]["sequences"] > 0) == fits


def test_an_unknown_weight_type_names_the_choices():
    result = CliRunner().invoke(app, ["profile-kv", "--preset", "Llama-2-70B", "--plan", "--memory", "80GiB",
                                      "--weights-type", "q9"])
    assert result.exit_code == 2 and "q4_k_m" in result.output and "--weights-type" in result.output
