"""The project's import rules as data, and a checker over the source tree (docs/architecture.md, "Layers").

Imports flow one way: rocmforge_cli -> profiles -> engine -> model -> ops -> runtime, with gguf, tokenizer
and kvcache between ops and runtime (below model, engine and ops), and hipcore.errors (and the kernel build tool,
rocmforge_kernels = kernels/) just above the runtime.
A module may import its own package and any layer below its own; two different packages of the same layer
never import each other; the runtime imports nothing else of the project. Imports inside functions count.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

# Package (longest prefix wins) -> layer, bottom = 0.
LAYERS = {
    "hipcore.runtime": 0,
    "hipcore.errors": 1, "rocmforge_kernels": 1,  # the kernel build tool reads the runtime's manifest helpers
    "hipcore.gguf": 2, "hipcore.tokenizer": 2, "hipcore.kvcache": 2,
    "hipcore.ops": 3,
    "hipcore.model": 4,
    "hipcore.engine": 5,
    "profiles": 6, "rocmforge_serve": 6,
    "rocmforge_cli": 7,
}
SOURCE_ROOTS = {"hipcore": "hipcore", "profiles": "profiles", "rocmforge_serve": "rocmforge_serve", "rocmforge_cli": "rocmforge_cli", "kernels": "rocmforge_kernels"}


@dataclass(frozen=True)
class Violation:
    importer: str
    imported: str
    line: int
    why: str

    def __str__(self) -> str:
        return f"{self.importer}:{self.line} imports {self.imported}: {self.why}"


def package_of(module: str) -> str | None:
    """The layered package a dotted module name belongs to, or None (third-party, stdlib, the hipcore facade)."""
    best = None
    for pkg in LAYERS:
        if (module == pkg or module.startswith(pkg + ".")) and (best is None or len(pkg) > len(best)):
            best = pkg
    return best


def imported_modules(source: str) -> list[tuple[str, int]]:
    """(dotted module, line) of every absolute import in a module's source, at any depth."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from hipcore.gguf import quants` imports hipcore.gguf.quants: judge the submodule too.
            found.append((node.module, node.lineno))
            found += [(f"{node.module}.{alias.name}", node.lineno) for alias in node.names]
    return found


def check_module(module: str, source: str) -> list[Violation]:
    """The imports of one module that run against the rules."""
    own = package_of(module)
    if own is None:
        return []
    out, seen = [], set()
    for name, line in imported_modules(source):
        pkg = package_of(name)
        if pkg is None or pkg == own or (line, pkg) in seen:
            continue
        seen.add((line, pkg))
        if own == "hipcore.runtime":
            out.append(Violation(module, name, line, "the runtime imports nothing else of the project"))
        elif LAYERS[pkg] > LAYERS[own]:
            out.append(Violation(module, name, line, f"{own} (layer {LAYERS[own]}) may not import upward into {pkg} (layer {LAYERS[pkg]})"))
        elif LAYERS[pkg] == LAYERS[own]:
            out.append(Violation(module, name, line, f"{own} and {pkg} are side by side in layer {LAYERS[own]}; neither imports the other"))
    return out


def module_name(path: Path, repo: Path) -> str:
    rel = path.relative_to(repo).with_suffix("")
    parts = list(rel.parts)
    parts[0] = SOURCE_ROOTS[parts[0]]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def check_tree(repo: Path) -> list[Violation]:
    out = []
    for root in SOURCE_ROOTS:
        for path in sorted((repo / root).rglob("*.py")):
            out += check_module(module_name(path, repo), path.read_text())
    return out


def unlayered_modules(repo: Path) -> list[str]:
    """Library modules outside every layered package (only the hipcore facade may be): a new top-level
    module would otherwise go unchecked."""
    names = [module_name(p, repo) for root in SOURCE_ROOTS for p in sorted((repo / root).rglob("*.py"))]
    return [n for n in names if package_of(n) is None and n != "hipcore"]


def import_cycles(modules: dict[str, str]) -> list[list[str]]:
    """Cycles among project modules (name -> source), counting imports inside functions too: a module that
    imports, even lazily, one that imports it back is one responsibility split in two."""
    def targets(src: str) -> set[str]:
        found = [(n, line) for n, line in imported_modules(src) if n in modules]
        # `from pkg import sub` reaches pkg.sub; the edge to pkg's __init__ alone would be a false loop.
        return {n for n, line in found if not any(o.startswith(n + ".") and ol == line for o, ol in found)}

    graph = {m: sorted(targets(src) - {m}) for m, src in modules.items()}
    cycles, state = [], {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = "open"
        stack.append(node)
        for nxt in graph[node]:
            if state.get(nxt) == "open":
                cycles.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    return cycles


def tree_modules(repo: Path) -> dict[str, str]:
    return {module_name(p, repo): p.read_text() for root in SOURCE_ROOTS for p in sorted((repo / root).rglob("*.py"))}
