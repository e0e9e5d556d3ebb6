"""An import-linter contract type that keeps a task on the engine's public modules: a task's modules
import from the engine only :mod:`ddp_engine.api` (and the shared libraries named beside it), and a
broken contract names each other import with the public name to use instead.

Used from a project's ``pyproject.toml``::

    [tool.importlinter]
    contract_types = ["public_modules: ddp_engine.contracts.PublicModulesContract"]

    [[tool.importlinter.contracts]]
    name = "The task imports the engine from its public modules only"
    type = "public_modules"
    source_modules = ["my_task"]
    public_modules = ["ddp_engine.api"]
"""

import re

from importlinter import Contract, ContractCheck, fields, output

#: The engine's package, whose modules other than the public ones a task may not import.
ENGINE = "ddp_engine"


class PublicModulesContract(Contract):
    """Modules of ``source_modules`` (and their submodules) import no module of the engine but
    ``public_modules`` (and their submodules) and the engine's package itself (``__version__``)."""

    source_modules = fields.ListField(subfield=fields.ModuleField())
    public_modules = fields.ListField(subfield=fields.StringField())

    def check(self, graph, verbose: bool) -> ContractCheck:
        found = []
        for source in self.source_modules:
            for importer in sorted({source.name, *graph.find_descendants(source.name)}):
                for imported in sorted(graph.find_modules_directly_imported_by(importer)):
                    if self._private(imported):
                        details = graph.get_import_details(importer=importer, imported=imported)
                        lines = [(detail["line_number"], detail["line_contents"]) for detail in details]
                        found.append({"importer": importer, "imported": imported, "lines": lines})
        return ContractCheck(kept=not found, metadata={"imports": found})

    def _private(self, module: str) -> bool:
        """Whether ``module`` is of the engine and not public."""
        inside = [name for name in self.public_modules if module == name or module.startswith(f"{name}.")]
        return module.startswith(f"{ENGINE}.") and not inside

    def render_broken_contract(self, check: ContractCheck) -> None:
        for found in check.metadata["imports"]:
            for number, line in found["lines"]:
                output.print_error(f"{found['importer']} imports {found['imported']} (line {number}):")
                for text in (line, *instead(found["imported"], line)):
                    output.print_error(f"    {text}", bold=False)
            output.new_line()


def instead(module: str, line: str) -> list[str]:
    """What a task writes instead of ``line``, an import from the engine's ``module``, which is not
    public: the names it imports that :mod:`ddp_engine.api` has, from there; and those it has not."""
    from ddp_engine.api import EXPORTS

    match = re.match(r"\s*from\s+\S+\s+import\s+\(?([^)#]*)", line)
    names = [name.split(" as ")[0].strip() for name in match[1].split(",") if name.strip()] if match else []
    names = names or [name for name, origin in EXPORTS.items() if origin == module]
    public = [name for name in names if name in EXPORTS]
    missing = [name for name in names if name not in EXPORTS]
    advice = [f"instead: from ddp_engine.api import {', '.join(public)}"] if public else []
    if missing or not names:
        advice.append(
            f"(ddp_engine.api has no {', '.join(missing) or 'name of ' + module}: the engine keeps it to itself)"
        )
    return advice
