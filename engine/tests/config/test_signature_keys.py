"""The keys of a ``data`` or ``model`` node that no schema types are its class's constructor
arguments: read from the class's source, following ``**kwargs`` to the base class it imports
(also through a re-export, such as ``ddp_engine.api``'s), so that a typo is refused before the
class, torch and Lightning are imported; from the imported class where the source cannot tell."""

import pytest

from ddp_engine.config import compose
from ddp_engine.config.compose import constructor_arguments


@pytest.mark.parametrize(
    "target",
    [
        "sensor_task.regression.SensorDataModule",  # **kwargs on to ddp_engine.api's ShardedDataModule
        "sensor_task.regression.Regressor",
        "sensor_task.regression.SensorNet",
        "vision_task.classifier.ImageClassifier",
        "ddp_engine.data.sharded.ShardedDataModule",
        "custom_datamodules.ShufflesAnewEachFit",  # no __init__ of its own: its base's, and on to the engine's
    ],
)
def test_the_sources_tell_the_arguments_the_imported_class_takes(target, monkeypatch):
    module, _, name = target.rpartition(".")
    from_source = compose._source_arguments(module, name)
    constructor_arguments.cache_clear()
    monkeypatch.setattr(compose, "_source_arguments", lambda *args, **kwargs: None)  # the imported class's
    imported = constructor_arguments(target)
    constructor_arguments.cache_clear()
    assert from_source is not None and from_source == imported


def test_a_base_the_source_cannot_follow_leaves_the_arguments_to_the_imported_class(tmp_path, monkeypatch):
    (tmp_path / "decoding.py").write_text(
        "import json\n\n\nclass Decoder(json.JSONDecoder):\n"
        "    def __init__(self, depth: int, **kwargs):\n        super().__init__(**kwargs)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert compose._source_arguments("decoding", "Decoder") is None  # json.JSONDecoder: an attribute
    arguments = constructor_arguments("decoding.Decoder")
    constructor_arguments.cache_clear()
    assert arguments == ("depth", "object_hook", "parse_float", "parse_int", "parse_constant", "strict",
                         "object_pairs_hook")  # fmt: skip
