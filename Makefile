# Two commands: `make train` and `make test`. Both create .venv on first use.
#   make train ARGS="trainer.devices=4 data.global_batch_size=256"
#   make test PYTEST_ARGS="-k data"

PYTHON ?= python3.11
VENV := .venv
# Marker file: the venv is rebuilt when pyproject.toml changes.
INSTALLED := $(VENV)/.installed

.PHONY: train test clean

$(INSTALLED): pyproject.toml
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --editable '.[dev]'
	touch $@

train: $(INSTALLED)
	$(VENV)/bin/python -m mnist_ddp.train $(ARGS)

test: $(INSTALLED)
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) src/*.egg-info .pytest_cache
