"""Python warnings reach the console through logging, from global rank 0 only."""

import logging

import pytest
from lightning.fabric.utilities.rank_zero import rank_zero_only

from ddp_engine.core.log_filters import RankZeroWarningsFilter


@pytest.mark.parametrize("rank", [0, 1])
def test_python_warnings_reach_the_console_from_rank_zero_only(rank, monkeypatch):
    monkeypatch.setattr(rank_zero_only, "rank", rank)
    warning = logging.LogRecord("py.warnings", logging.WARNING, __file__, 1, "deprecated", None, None)
    info = logging.LogRecord("ddp_engine.run.train", logging.INFO, __file__, 1, "Composed config", None, None)
    assert RankZeroWarningsFilter().filter(warning) == (rank == 0)
    assert RankZeroWarningsFilter().filter(info)
