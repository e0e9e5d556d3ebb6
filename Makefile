# Two commands: `make train` and `make test`. Both create .venv on first use.
# `make rename NAME=my-project` makes the template your project (see below).
#   make train ARGS="trainer.devices=4 data.global_batch_size=256"
#   make test PYTEST_ARGS="-k data"
# `make test-fast` runs the in-process tests only (every test not marked `processes`; under 2 minutes
# on 2 cores); `make test-task` the task's own (marked `task`); `make test` is the whole suite, with
# the real DDP processes and command lines (what CI runs). `make test-floors` runs the in-process tests
# on the version ranges' floors, `make test-private-apis` the default training with each private API
# that the engine reads hidden alone (docs/testing.md).
# And the benchmark against a hand-written DDP loop and plain Lightning (about 27 minutes on 2 CPU
# cores), which writes benchmarks/results.md, benchmarks/per_step.md and the results sections of
# docs/performance.md:
#   make benchmark BENCH_ARGS="--data-dir /path/to/data"   (flags both harnesses take: --data-dir, --nproc)
# On a machine with NVIDIA GPUs, what CPUs cannot run (under 8 minutes; benchmarks/gpu_check.py), with
# the results in benchmarks/gpu_check.md and .json:
#   make gpu-check GPU_CHECK_ARGS="--data-dir /path/to/data"

PYTHON ?= python3.11
VENV := .venv
# The project's import package: its distribution's name (pyproject.toml) with _ for -, as make rename sets it.
PACKAGE := $(subst -,_,$(shell sed -n 's/^name = "\(.*\)"$$/\1/p' pyproject.toml | head -n 1))
# Marker file: the venv is rebuilt when either pyproject.toml or the constraints change.
INSTALLED := $(VENV)/.installed
# The versions the whole suite passed on (constraints.txt), installed by default; `CONSTRAINTS=` (empty)
# takes the newest releases the pyproject.toml ranges allow instead: make clean && make test CONSTRAINTS=
CONSTRAINTS ?= constraints.txt

.PHONY: train test test-fast test-task test-floors test-private-apis benchmark benchmark-scaling gpu-check rename clean

# The engine (engine/, its own distribution) and this project, both editable: an edit takes effect at once.
$(INSTALLED): pyproject.toml engine/pyproject.toml $(CONSTRAINTS)
	test -x $(VENV)/bin/python || $(PYTHON) -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet $(if $(CONSTRAINTS),--constraint $(CONSTRAINTS)) \
		--editable ./engine --editable '.[dev]'
	touch $@

train: $(INSTALLED)
	$(VENV)/bin/python -m $(PACKAGE).train $(ARGS)

test: $(INSTALLED)
	$(VENV)/bin/python -m pytest $(PYTEST_ARGS)

test-fast: $(INSTALLED)
	$(VENV)/bin/python -m pytest -m "not processes" $(PYTEST_ARGS)

# The task's own tests (marked `task`): its DataModule's conformance on real processes, one short
# DDP run, one exact resume; what a clone runs after changing its task, apart from the engine's.
test-task: $(INSTALLED)
	$(VENV)/bin/python -m pytest -m task $(PYTEST_ARGS)

# The default training with each private API that the engine's compat reads hidden alone, as a
# library's release that renames it would (marked in_turn; make test hides them all at once): run it
# after a new version enters constraints.txt.
test-private-apis: $(INSTALLED)
	$(VENV)/bin/python -m pytest -m in_turn --dist load $(PYTEST_ARGS)

# The floors of the version ranges (floors.txt) in a venv of their own, .venv-floors, and the in-process
# tests on them: every `>=` of both pyproject.toml is a version the code runs on.
test-floors:
	test -x .venv-floors/bin/python || $(PYTHON) -m venv .venv-floors
	.venv-floors/bin/python -m pip install --quiet --constraint floors.txt --editable ./engine --editable '.[dev]'
	.venv-floors/bin/python -m pytest -m "not processes" $(PYTEST_ARGS)

benchmark: $(INSTALLED)
	$(VENV)/bin/python -m benchmarks.run --page docs/performance.md $(BENCH_ARGS)
	$(VENV)/bin/python -m benchmarks.per_step --page docs/performance.md $(BENCH_ARGS)

# DDP scaling: samples/s, scaling efficiency and exposed communication for 1, 2 and 4 processes, each
# with the plain AllReduce, fp16 and PowerSGD (about 6 minutes on 2 CPU cores; benchmarks/scaling.py):
#   make benchmark-scaling SCALING_ARGS="--data-dir /path/to/data"
benchmark-scaling: $(INSTALLED)
	$(VENV)/bin/python -m benchmarks.scaling --page docs/performance.md $(SCALING_ARGS)

gpu-check: $(INSTALLED)
	$(VENV)/bin/python -m benchmarks.gpu_check $(GPU_CHECK_ARGS)

# Make the template your project: `make rename NAME=fashion-ddp` renames the distribution,
# the package (src/fashion_ddp), its imports, console scripts and Hydra targets (tools/rename.py).
# Then the Python files it changed are laid out for the new name by the commit hooks (ruff), from .venv.
rename:
	$(PYTHON) tools/rename.py $(NAME) --layout-follows && $(MAKE) $(INSTALLED) && $(VENV)/bin/python tools/rename.py --layout

clean:
	rm -rf $(VENV) src/*.egg-info engine/src/*.egg-info .pytest_cache
