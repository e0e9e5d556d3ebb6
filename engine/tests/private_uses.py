"""Where source uses a private API of a library, which ``ddp_engine.core.compat`` alone may: the scan
behind the fence around compat. The engine's tests run it on the engine's packages and its test
tasks; a project's tests run it on their own task's package.

Test modules import it with ``from private_uses import ...`` (engine/tests is on pytest's ``pythonpath``).
"""

import ast
import importlib
import inspect
import pkgutil
import re
import sys
import textwrap
from collections.abc import Collection, Iterable
from pathlib import Path
from types import ModuleType

#: Private names that are not a library's private API: os's, and Hydra's documented ``_target_`` key.
ALLOWED = {("os", "_exit"), ("os", "_Environ"), (None, "_target_")}
#: Attributes of Lightning's private loop classes, reached through public-looking names.
LOOP_INTERNALS = {"epoch_loop", "batch_progress"}
#: The key of Lightning's checkpoint layout that only compat may read.
CHECKPOINT_INTERNALS = {"combined_loader"}
#: A dotted path (a module, or a class in one), as a string may name one.
DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)+")
#: The module that may use private APIs, and the ways a module names it.
COMPAT = "ddp_engine.core.compat"


def private(name: str) -> bool:
    return name.startswith("_") and not name.endswith("__")


def private_module(path: str) -> bool:
    """Whether the dotted ``path`` goes through a private module of a library (``hydra._internal``)."""
    return any(private(part) and (None, part) not in ALLOWED for part in path.split("."))


def private_uses(tree: ast.AST) -> list[tuple[int, str]]:
    """``(line, what)`` of each use of a private API in ``tree``, outside ``self`` and ``cls``."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            receiver = node.value
            owner = receiver.id if isinstance(receiver, ast.Name) else None
            if node.attr in LOOP_INTERNALS:
                found.append((node.lineno, f".{node.attr} (Lightning's loops)"))
            elif not private(node.attr) or owner in ("self", "cls"):
                continue
            elif (owner, node.attr) not in ALLOWED and (None, node.attr) not in ALLOWED:
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("getattr", "setattr", "hasattr"):
            if len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and private(str(node.args[1].value)):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Constant) and node.value in CHECKPOINT_INTERNALS:
            found.append((node.lineno, repr(node.value)))
        elif isinstance(node, ast.ImportFrom) and private_module(node.module or ""):
            found.append((node.lineno, f"from {node.module} import ..."))
        elif isinstance(node, ast.Import):
            found += [(node.lineno, f"import {alias.name}") for alias in node.names if private_module(alias.name)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and DOTTED.fullmatch(node.value):
            if private_module(node.value):  # a class path: "hydra._internal.<...>.BasicSweeper"
                found.append((node.lineno, repr(node.value)))
    return found


def package_private_uses(package: Path, skip: Collection[Path] = ()) -> list[str]:
    """``<path>:<line>: <what>`` of each use of a private API in the modules of the folder ``package``
    (paths from its parent), the modules in ``skip`` left out."""
    return [
        f"{path.relative_to(package.parent)}:{line}: {what}"
        for path in sorted(package.rglob("*.py"))
        if path not in skip
        for line, what in private_uses(ast.parse(path.read_text()))
    ]


def compat_imports(package: Path) -> list[str]:
    """``<path>:<line>`` of each import of ``ddp_engine.core.compat`` in the modules of the folder ``package``."""
    module, _, name = COMPAT.rpartition(".")
    return [
        f"{path.relative_to(package.parent)}:{node.lineno}"
        for path in sorted(package.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text()))
        if (isinstance(node, ast.ImportFrom) and (node.module == COMPAT or (node.module == module and any(
            alias.name == name for alias in node.names))))
        or (isinstance(node, ast.Import) and any(alias.name == COMPAT for alias in node.names))
    ]  # fmt: skip


def defined_classes(packages: Iterable[ModuleType]) -> list[type]:
    """Every class defined in the modules of ``packages`` (each module imported)."""
    found = []
    for package in packages:
        for info in pkgutil.walk_packages(package.__path__, f"{package.__name__}."):
            module = importlib.import_module(info.name)
            found += [
                value for value in vars(module).values() if isinstance(value, type) and value.__module__ == info.name
            ]
    return found


def library_names(base: type) -> set[str]:
    """The private names a library class has: its attributes, and the ``self._x`` in its source."""
    names = {name for name in dir(base) if private(name)}
    try:
        names |= set(re.findall(r"self\.(_\w+)", inspect.getsource(base)))
    except (OSError, TypeError):  # compiled
        pass
    return names


def library(cls: type, own: Collection[str]) -> bool:
    """Whether ``cls`` is a library's: not of the top-level packages ``own``, builtins or the standard library."""
    root = cls.__module__.partition(".")[0]
    return root not in own and root != "builtins" and root not in sys.stdlib_module_names


def library_private_names_touched(classes: Iterable[type], own: Collection[str]) -> list[str]:
    """``<module>.<class>: <name> (line <n> of the class)`` for each private name of a library base
    class (:func:`library`) that one of ``classes`` uses or overrides."""
    found = []
    for cls in classes:
        taken = set().union(*(library_names(base) for base in cls.__mro__[1:] if library(base, own)))
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.Attribute):
                name = node.name if isinstance(node, ast.FunctionDef) else node.attr
                if name in taken:
                    found.append(f"{cls.__module__}.{cls.__qualname__}: {name} (line {node.lineno} of the class)")
    return found
