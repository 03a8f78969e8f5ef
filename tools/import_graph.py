"""The import graph of mlx_ring, server.py and shard.py: module cycles, each part's arrows, and any
arrow up or sideways between the floors docs/development.md names (Conventions). Exits 1 on either.

    python tools/import_graph.py
"""

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# mlx_ring/*.py: the ground floor
GROUND = {p.stem for p in (ROOT / "mlx_ring").glob("*.py")} - {"__init__"}
FLOOR = {
    "ground": 0,
    "ring": 1,
    "models": 1,
    "cache": 2,
    "tensor": 2,
    "planning": 3,
    "serving": 4,
    "hosts": 4,
    "api": 5,
    "launcher": 6,
    "shard": 6,
    "server": 7,
}


def modules(root: Path) -> dict[str, Path]:
    files = [*sorted((root / "mlx_ring").rglob("*.py")), root / "server.py", root / "shard.py"]
    out = {}
    for p in files:
        parts = list(p.relative_to(root).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def edges(mods: dict[str, Path]) -> dict[str, set[str]]:
    """Each module's imports among `mods` (`from pkg import mod` counts as pkg.mod), those that run:
    an import under `if TYPE_CHECKING:` only names a type for the checker."""
    out = {}
    for m, p in mods.items():
        found = set()
        tree = ast.parse(p.read_text())
        typing_only = {
            id(n)
            for block in ast.walk(tree)
            if isinstance(block, ast.If)
            and getattr(block.test, "id", getattr(block.test, "attr", None)) == "TYPE_CHECKING"
            for stmt in block.body
            for n in ast.walk(stmt)
        }
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name in mods}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    found |= (
                        {sub} if sub in mods else {node.module} if node.module in mods else set()
                    )
        out[m] = found - {m}
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    state, found = {}, []

    def visit(u: str, path: list[str]) -> None:
        state[u] = "open"
        for v in sorted(graph[u]):
            if state.get(v) == "open":
                found.append([*path[path.index(v) :], u, v] if v in path else [u, v])
            elif v not in state:
                visit(v, [*path, u])
        state[u] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m, [])
    return found


def part(module: str) -> str:
    p = module.split(".")
    if p[0] != "mlx_ring":
        return p[0]
    return "ground" if len(p) == 1 or p[1] in GROUND else p[1]


def main() -> int:
    graph = edges(modules(ROOT))
    loops = cycles(graph)
    arrows, wrong = {}, []
    for m, out in sorted(graph.items()):
        for v in sorted(out):
            a, b = part(m), part(v)
            if a != b:
                arrows.setdefault(a, set()).add(b)
                if FLOOR[b] >= FLOOR[a]:
                    wrong.append(f"{m} -> {v}")
    print("module cycles:", loops or "none")
    for a in sorted(arrows, key=FLOOR.get):
        print(f"  {a:9s} (floor {FLOOR[a]}) -> {', '.join(sorted(arrows[a], key=FLOOR.get))}")
    print("arrows up or sideways:", wrong or "none")
    return 1 if loops or wrong else 0


if __name__ == "__main__":
    sys.exit(main())
