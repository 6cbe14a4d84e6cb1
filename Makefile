# The course's commands. Every target first runs tools/setup.sh, which installs what is missing
# (a .venv with the pinned packages, the helpers, Horovod) and returns at once when nothing is.
SHELL := /bin/bash
VENV := .venv
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
PY := $(VENV)/bin/python
# Extra arguments for `make lab`, e.g. LAB_ARGS="--no-browser --port 8890"
LAB_ARGS ?=
# JupyterLab refuses to run as root unless told; containers (Docker, Colab) often are root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root)
# `make grade SUBMISSIONS=dir [LAB=01-input-pipeline] [OUT=grades.csv]`
LAB ?= 01-input-pipeline
OUT ?= grades.csv

.PHONY: help setup lab test labs grade solutions bench soak clean

help:
	@echo "make lab    set up (first time only) and open JupyterLab on the course's start page"
	@echo "make test   set up and run every test: helpers, notebooks, labs in sync, grading"
	@echo "make labs   regenerate labs/ (student copies) from solutions/"
	@echo "make grade SUBMISSIONS=dir [LAB=...] [OUT=grades.csv]   autograde a folder of submissions"
	@echo "make solutions [SOLUTIONS_ARGS=--ci]   run every course and solution notebook on this"
	@echo "            machine's hardware; report in build/solutions/report.md (exit 1 on a failure)"
	@echo "make bench  run every benchmark side by side, print ratios vs goals, plots in build/bench/"
	@echo "make soak [SOAK_ARGS=...]   every kind of distributed launch, repeated under a CPU hog,"
	@echo "            plus a burst of 20; ends with 'soak: N launches, F failed' (about 30 min)"

setup:
	@bash tools/setup.sh

lab: setup
	$(VENV)/bin/jupyter lab --ServerApp.root_dir=$(CURDIR) course/00-setup-and-devices.ipynb $(ROOT_FLAG) $(LAB_ARGS)

test: setup
	$(PY) tools/notebooks.py
	$(PY) -m pytest tests build/nbtest --nbval-lax --nbval-current-env --nbval-cell-timeout=300 \
	  --nbval-sanitize-with tests/sanitize.cfg -p no:cacheprovider -rs --durations=15 $(PYTEST_ARGS)

labs: setup
	$(PY) tools/labs.py generate

grade: setup
	@test -n "$(SUBMISSIONS)" || { echo "usage: make grade SUBMISSIONS=dir [LAB=$(LAB)] [OUT=$(OUT)]"; exit 2; }
	$(PY) tools/grade.py "$(SUBMISSIONS)" --lab "$(LAB)" --out "$(OUT)"

# `make solutions [SOLUTIONS_ARGS="--ci --only 07"]`: every notebook of tests/notebooks.yml, executed
# with parameters for the hardware present (CPU, one GPU, several GPUs).
SOLUTIONS_ARGS ?=
solutions: setup
	$(PY) tools/solutions.py $(SOLUTIONS_ARGS)

# `make bench [BENCH_ARGS="--quick"]`: every benchmark, ratios vs goals; results in build/bench/.
BENCH_ARGS ?=
bench: setup
	$(PY) benchmarks/run_all.py $(BENCH_ARGS)

# `make soak [SOAK_ARGS="--rounds 5 --only lab7"]`: launches under load; results in build/soak/.
SOAK_ARGS ?=
soak: setup
	$(PY) benchmarks/soak.py $(SOAK_ARGS)

clean:
	rm -rf build course/runs solutions/*/runs
