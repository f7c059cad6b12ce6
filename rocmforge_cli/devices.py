"""`rocmforge devices`: what hardware was found, which device --device auto takes, and why."""

from __future__ import annotations

import json
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from hipcore.runtime.selection import pick_device
from hipcore.runtime.ledger import format_bytes
from hipcore.runtime.selection import DeviceInventory, DeviceSummary, discover_devices
from rocmforge_cli.common import handle_errors, stderr, stdout
from rocmforge_cli.options import device_option, json_option


def code_objects_for(arch: str) -> Optional[list[str]]:
    """The precompiled code objects the kernel loader has for `arch`, or None when it cannot tell."""
    if arch == "cpu":
        return None
    try:
        from hipcore.runtime import kernels
    except ImportError:
        return None
    lister = getattr(kernels, "available_code_objects", None)
    if lister is None:
        return None
    try:
        return list(lister(arch))
    except Exception as exc:  # noqa: BLE001 - a broken manifest must not hide the device list
        stderr.print(f"warning: could not list code objects for {arch}: {exc}", markup=False)
        return None


def _code_objects_cell(summary: DeviceSummary, objects: Optional[list[str]]) -> str:
    if summary.backend == "cpu":
        return "host kernels (numpy)"
    if objects is None:
        return "n/a"
    return ", ".join(objects) if objects else f"none for {summary.arch} (kernels compile at run time)"


def inventory_json(inventory: DeviceInventory) -> dict[str, Any]:
    choice = inventory.auto_choice
    return {
        "devices": [
            {
                "backend": d.backend, "index": d.index, "name": d.name, "arch": d.arch,
                "total_bytes": d.total_bytes, "free_bytes": d.free_bytes,
                "code_objects": code_objects_for(d.arch),
            }
            for d in inventory.found
        ],
        "auto": f"{choice.backend}:{choice.index}",
        "unavailable": dict(inventory.unavailable),
        "reasons": inventory.auto_reasons(),
    }


def render_inventory(inventory: DeviceInventory) -> None:
    table = Table(title="Devices", title_justify="left")
    for column, justify in (("backend", "left"), ("index", "right"), ("name", "left"), ("arch", "left"),
                            ("total", "right"), ("free", "right"), ("precompiled code objects", "left")):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for d in inventory.found:
        table.add_row(d.backend, str(d.index), d.name, d.arch, format_bytes(d.total_bytes), format_bytes(d.free_bytes),
                      _code_objects_cell(d, code_objects_for(d.arch)))
    stdout.print(table, soft_wrap=False)
    choice = inventory.auto_choice
    stdout.print(f"--device auto takes {choice.backend}:{choice.index}:", markup=False)
    for line in inventory.auto_reasons():
        stdout.print(f"  {line}", markup=False)


@handle_errors
def devices_command(
    as_json: Annotated[bool, json_option("Print the devices and the reasons as JSON instead of a table.")] = False,
    device: Annotated[Optional[str], device_option(
        "Check one --device value instead of listing everything: open it and show it, or say why it "
        "cannot be used. One of auto, hip, cuda, cpu, optionally with an index (cuda:1).")] = None,
) -> None:
    """List the GPUs rocmforge can use (AMD through HIP, NVIDIA through CUDA) and the CPU backend, with their memory and precompiled kernels, and say which one --device auto takes and why the others were not.

    Examples:
      rocmforge devices
      rocmforge devices -d cuda:1        (open that one GPU, or say why it cannot be used)
      rocmforge devices --json
    """
    if device is not None:
        choice = pick_device(device)
        try:
            info = choice.device.memory_info()
            summary = DeviceSummary(choice.device.backend, choice.device.index, choice.device.name,
                                    choice.device.arch, info.total, info.free)
        finally:
            choice.device.close()
        if as_json:
            print(json.dumps({"device": f"{summary.backend}:{summary.index}", "name": summary.name,
                              "arch": summary.arch, "total_bytes": summary.total_bytes,
                              "free_bytes": summary.free_bytes, "reasons": choice.reasons}, indent=2))
            return
        stdout.print(f"{summary.backend}:{summary.index} {summary.name} ({summary.arch}), "
                     f"{format_bytes(summary.total_bytes)} total, {format_bytes(summary.free_bytes)} free", markup=False)
        for line in choice.reasons:
            stdout.print(f"  {line}", markup=False)
        return
    inventory = discover_devices()
    if as_json:
        print(json.dumps(inventory_json(inventory), indent=2))
    else:
        render_inventory(inventory)
