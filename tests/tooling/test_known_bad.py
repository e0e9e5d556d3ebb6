"""No release in known-bad.txt can install: every range of both pyproject.toml files excludes it,
and neither constraints.txt nor floors.txt pins it."""

from pathlib import Path

import pytest
import tomllib
from helpers import REPO
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

PYPROJECTS = (REPO / "pyproject.toml", REPO / "engine" / "pyproject.toml")
PINS = (REPO / "constraints.txt", REPO / "floors.txt")


def requirements(path: Path) -> list[Requirement]:
    """The requirements of a requirements-style file (one per line, ``#`` comments)."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [Requirement(line) for line in lines if line]


def known_bad() -> list[tuple[str, Version]]:
    """(name, version) of each release in known-bad.txt."""
    bad = []
    for requirement in requirements(REPO / "known-bad.txt"):
        (specifier,) = requirement.specifier
        assert specifier.operator == "==", f"known-bad.txt: {requirement}: name one release (==)"
        bad.append((canonicalize_name(requirement.name), Version(specifier.version)))
    return bad


def ranges(path: Path) -> list[Requirement]:
    """Every dependency of a pyproject.toml: its own and those of each extra."""
    project = tomllib.loads(path.read_text())["project"]
    extras = project.get("optional-dependencies", {}).values()
    return [Requirement(line) for line in [*project["dependencies"], *(item for extra in extras for item in extra)]]


def admitted(requirement_lists: list[tuple[str, list[Requirement]]]) -> list[str]:
    """``file: requirement admits name==version`` for each known-bad release a requirement admits."""
    found = []
    for where, listed in requirement_lists:
        for requirement in listed:
            for name, version in known_bad():
                same = canonicalize_name(requirement.name) == name
                if same and requirement.specifier.contains(version, prereleases=True):
                    found.append(f"{where}: {requirement} admits {name}=={version}")
    return found


def test_the_list_names_the_compromised_lightning_releases():
    assert {("lightning", Version("2.6.2")), ("lightning", Version("2.6.3"))} <= set(known_bad())


def test_no_range_constraint_or_floor_admits_a_known_bad_release():
    files = [(path.relative_to(REPO).as_posix(), ranges(path)) for path in PYPROJECTS]
    files += [(path.name, requirements(path)) for path in PINS]
    assert admitted(files) == []


@pytest.mark.parametrize("requirement", ["lightning>=2.6", "lightning==2.6.3", "Lightning>=2.5,<2.7"])
def test_a_range_that_admits_one_is_found(requirement):
    assert admitted([("pyproject.toml", [Requirement(requirement)])]) != []
