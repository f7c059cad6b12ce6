"""What a built code object holds: its ELF header and kernel symbols, and the compiler's report of the
registers and memory each kernel uses. Used by build.py to fill the manifest.

Both vendors' code objects are ELF64 little-endian files: AMDGPU ones (e_machine 224, the gfx target
in the low byte of e_flags) and CUDA cubins (e_machine 190, the sm in e_flags). Kernels are the
global function symbols of .symtab.

Register use comes from the compiler's own report, captured from stderr:
- clang (AMD): `-Rpass-analysis=kernel-resource-usage` remarks, one block per kernel:
  "remark: Function Name: rmsnorm_f32", "remark:     VGPRs: 12", "TotalSGPRs: 24" (older clangs say
  "SGPRs:"), "ScratchSize [bytes/lane]: 0", "LDS Size [bytes/block]: 128", "... Spill: 0".
- nvcc (NVIDIA): `-Xptxas -v`: "Compiling entry function 'rmsnorm_f32' for 'sm_90'",
  "N bytes stack frame, N bytes spill stores, N bytes spill loads",
  "Used 16 registers, used 1 barriers, 128 bytes smem, ...".
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

EM_CUDA = 190
EM_AMDGPU = 224
SHT_SYMTAB = 2
STT_FUNC = 2
STB_GLOBAL = 1


class CodeObjectError(ValueError):
    """The file is not the ELF code object it should be."""


@dataclass(frozen=True)
class ElfSummary:
    machine: int
    flags: int
    abi_version: int
    functions: tuple[str, ...] = field(default=())  # global function symbols, sorted


def read_elf(data: bytes) -> ElfSummary:
    """Header fields and global function symbols of an ELF64 little-endian file."""
    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise CodeObjectError("not an ELF file")
    if data[4] != 2 or data[5] != 1:
        raise CodeObjectError("not a 64-bit little-endian ELF file")
    (machine,) = struct.unpack_from("<H", data, 18)
    (shoff,) = struct.unpack_from("<Q", data, 40)
    (flags,) = struct.unpack_from("<I", data, 48)
    shentsize, shnum = struct.unpack_from("<HH", data, 58)
    if shentsize != 64 or shoff + shnum * 64 > len(data):
        raise CodeObjectError("section header table outside the file")
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * 64) for i in range(shnum)]
    functions: list[str] = []
    for _name, kind, _flags, _addr, offset, size, link, _info, _align, entsize in sections:
        if kind != SHT_SYMTAB:
            continue
        if entsize != 24 or offset + size > len(data) or link >= shnum:
            raise CodeObjectError("malformed symbol table")
        str_offset, str_size = sections[link][4], sections[link][5]
        strings = data[str_offset:str_offset + str_size]
        for at in range(offset, offset + size, 24):
            name_at, info = struct.unpack_from("<IB", data, at)
            if info & 0xF == STT_FUNC and info >> 4 == STB_GLOBAL:
                end = strings.find(b"\0", name_at)
                functions.append(strings[name_at:end if end >= 0 else None].decode(errors="replace"))
    return ElfSummary(machine=machine, flags=flags, abi_version=data[8], functions=tuple(sorted(set(functions))))


def cuda_sm(summary: ElfSummary) -> int:
    """The sm a cubin is for (90 for sm_90). CUDA 12.8+ writes ELF ABI version 8 with the sm in bits
    8..15 of e_flags; earlier toolkits put it in the low byte."""
    return (summary.flags >> 8) & 0xFF if summary.abi_version >= 8 else summary.flags & 0xFF


# ---- resource usage --------------------------------------------------------------------------

_REMARK = re.compile(r"remark:\s+(?P<key>[A-Za-z][A-Za-z ]*?)(?: \[[^\]]*\])?:\s+(?P<value>\S+)\s+\[-Rpass-analysis")
_AMD_KEYS = {
    "VGPRs": "vgprs", "AGPRs": "agprs", "TotalSGPRs": "sgprs", "SGPRs": "sgprs",
    "ScratchSize": "scratch_bytes", "LDS Size": "shared_bytes", "Occupancy": "occupancy_waves_per_simd",
    "SGPRs Spill": "sgpr_spills", "VGPRs Spill": "vgpr_spills",
}


def parse_amdgpu_remarks(text: str) -> dict[str, dict[str, int]]:
    """kernel name -> {"registers": VGPRs, "vgprs", "agprs", "sgprs", "shared_bytes", ...}."""
    usage: dict[str, dict[str, int]] = {}
    current: dict[str, int] | None = None
    for line in text.splitlines():
        if "remark:" not in line:
            continue
        name = re.search(r"remark: Function Name: (\S+)", line)
        if name:
            current = usage.setdefault(name.group(1), {})
            continue
        match = _REMARK.search(line)
        if current is None or not match:
            continue
        key = _AMD_KEYS.get(match.group("key").strip())
        value = match.group("value")
        if key and value.isdigit():
            current[key] = int(value)
    for values in usage.values():
        if "vgprs" in values:
            values["registers"] = values["vgprs"]
    return usage


def parse_ptxas_verbose(text: str) -> dict[str, dict[str, int]]:
    """kernel name -> {"registers", "shared_bytes", "stack_bytes", "spill_store_bytes", "spill_load_bytes"}."""
    usage: dict[str, dict[str, int]] = {}
    current: dict[str, int] | None = None
    for line in text.splitlines():
        entry = re.search(r"(?:Compiling entry function|Function properties for) '?([A-Za-z_][\w$]*)'?", line)
        if entry:
            current = usage.setdefault(entry.group(1), {})
            continue
        if current is None:
            continue
        used = re.search(r"Used (\d+) registers", line)
        if used:
            current["registers"] = int(used.group(1))
            smem = re.search(r"(\d+) bytes smem", line)
            current["shared_bytes"] = int(smem.group(1)) if smem else 0
        frame = re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if frame:
            current["stack_bytes"], current["spill_store_bytes"], current["spill_load_bytes"] = map(int, frame.groups())
    return usage
