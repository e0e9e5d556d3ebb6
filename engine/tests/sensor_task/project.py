"""This test project as the engine sees it: its package and its configs' folder (no schemas of its
own: its YAML is checked against the engine's schema and its classes' signatures)."""

from pathlib import Path

from ddp_engine.project import Project

CONFIG_DIR = Path(__file__).resolve().parent / "conf"
PROJECT = Project(package=__package__, config_dir=CONFIG_DIR)
