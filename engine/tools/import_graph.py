"""Print the engine's import graph by layer: which of its packages each one imports.

    python engine/tools/import_graph.py [--modules | --cycles]

One line per package of the engine (``engine/src/ddp_engine``), in the order of the layer contract
in ``engine/pyproject.toml``, highest first, with the packages it imports directly; ``--modules``
lists the module-to-module imports under each. Read by grimp, the import graph library behind
import-linter, from the source files: nothing of the package is run. ``--cycles`` prints instead
each loop of modules that import each other (inside a package too, where the layer contract does
not look) and exits 1 if there is one.
"""

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import grimp
import tomllib

#: ``engine/``: its ``pyproject.toml`` and ``src/``.
ROOT = Path(__file__).resolve().parents[1]


def layers() -> list[str]:
    """The layer contract's layers, highest first (``a | b`` split into ``a``, ``b``)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    (contract,) = (contract for contract in config["contracts"] if contract["type"] == "layers")
    return [name.strip() for layer in contract["layers"] for name in layer.split("|")]


def module_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """Each loop of modules that import each other, as the chain ``[a, b, ..., a]``, once per set of modules."""
    cycles, seen = [], set()
    for module in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(module)):
            chain = graph.find_shortest_chain(importer=imported, imported=module)
            if chain and frozenset(chain) not in seen:
                seen.add(frozenset(chain))
                cycles.append([module, *chain])
    return cycles


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--modules", action="store_true", help="list the module imports under each package")
    parser.add_argument("--cycles", action="store_true", help="list the loops of modules; exit 1 if there is one")
    args = parser.parse_args()
    sys.path[:0] = [str(ROOT / "src")]
    graph = grimp.build_graph("ddp_engine", cache_dir=None)
    if args.cycles:
        cycles = module_cycles(graph)
        for cycle in cycles:
            print(" -> ".join(cycle))
        print(f"{len(cycles)} loop(s) of modules that import each other")
        sys.exit(1 if cycles else 0)

    def package(module: str) -> str:
        parts = module.split(".")
        return parts[1] if len(parts) > 1 else "<root>"

    imports: dict[str, set[str]] = defaultdict(set)
    details: dict[str, set[str]] = defaultdict(set)
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            if package(imported) != package(module):
                imports[package(module)].add(package(imported))
                details[package(module)].add(f"{module} -> {imported}")
    order = layers()
    for name in order:
        print(f"{name:15} -> {', '.join(sorted(imports[name], key=order.index)) or '(nothing of the engine)'}")
        if args.modules:
            for line in sorted(details[name]):
                print(f"    {line}")


if __name__ == "__main__":
    main()
