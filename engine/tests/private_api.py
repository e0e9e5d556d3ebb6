"""Hiding a private name of a library from ``ddp_engine.core.compat``, as a release that renames it
would: in this process (:func:`hidden_private_api`, for ``monkeypatch``) or in every process of a
command (:func:`hiding_sitecustomize`); and reading what compat said it lost (:func:`lost_lines`).

compat reads every private name through one accessor, ``compat._private(owner, name)``; the
libraries themselves keep using theirs, so a run is otherwise the same.
"""

import ast
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any

#: What compat logs, once per name and process, when a private name is missing or changed.
LOST = " is missing or changed in the installed version: "


def hidden_private_api(private: Callable[[Any, str], Any], hidden: Collection[str]) -> Callable[[Any, str], Any]:
    """compat's accessor ``private`` with the names in ``hidden`` missing (read when called)."""

    def accessor(owner: Any, name: str) -> Any:
        if name in hidden:
            raise AttributeError(f"{type(owner).__name__!r} object has no attribute {name!r} (hidden by a test)")
        return private(owner, name)

    return accessor


def compat_private_names() -> set[str]:
    """Every private name that compat reads or replaces: the names it passes to its accessors."""
    import ddp_engine.core.compat as compat

    tree = ast.parse(Path(compat.__file__).read_text())
    return {
        node.args[1].value
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) in ("_private", "_replace")
        and len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
    }  # fmt: skip


def hiding_sitecustomize(folder: Path, hidden: Collection[str]) -> Path:
    """``folder``, holding a ``sitecustomize`` module that hides ``hidden`` from compat in the
    process that imports it: first on a command's PYTHONPATH, Python imports it at start-up in
    the command's every process (the forkservers' and the workers' included)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "sitecustomize.py").write_text(
        "import ddp_engine.core.compat as compat\n"
        "from private_api import hidden_private_api\n"
        f"compat._private = hidden_private_api(compat._private, {sorted(hidden)!r})\n"
    )
    return folder


def lost_lines(caplog: Any) -> list[str]:
    """The private names compat said it lost, in the order it said them, from pytest's ``caplog``."""
    return [record.getMessage().split(LOST)[0] for record in caplog.records if LOST in record.getMessage()]
