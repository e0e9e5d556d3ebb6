"""The engine's config groups (:mod:`ddp_engine.conf`) on Hydra's search path, after the project's
``conf/``: every Hydra command and ``compose`` of a project finds ``trainer``, ``strategy``,
``launcher``, ``logger``, ``callbacks``, ``paths``, ``debug``, ``hydra`` and ``seed`` there, and a
project's YAML of the same group and name comes first. A search-path plugin, as Hydra's documented
way for an installed package to ship configs, rather than ``hydra.searchpath`` in the project's
YAML: a command line's ``hydra.searchpath=[...]`` replaces that list, and would drop the engine's."""

from hydra.core.config_search_path import ConfigSearchPath
from hydra.plugins.search_path_plugin import SearchPathPlugin


class DDPEngineSearchPathPlugin(SearchPathPlugin):
    """Appends ``pkg://ddp_engine.conf``, then the image machinery's ``pkg://ddp_engine.vision.conf``
    (``data=folder``, the base of image data sets), to Hydra's config search path."""

    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        search_path.append(provider="ddp-engine", path="pkg://ddp_engine.conf")
        search_path.append(provider="ddp-engine-vision", path="pkg://ddp_engine.vision.conf")
