# The course's commands. Every target first runs src/dpc_setup/setup.sh, which installs what is missing
# (a .venv with the pinned packages, the helpers, Horovod) and returns at once when nothing is.
SHELL := /bin/bash
VENV := .venv
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
PY := $(VENV)/bin/python
# Extra arguments for `make lab`, e.g. LAB_ARGS="--no-browser --port 8890"
LAB_ARGS ?=
# JupyterLab refuses to run as root unless told; containers (Docker, Colab) often are root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root)
# `make grade SUBMISSIONS=dir [LAB=01-input-pipeline] [OUT=grades.csv] [JOBS=N] [COURSE=dir]`
LAB ?= 01-input-pipeline
OUT ?= grades.csv
# The course gradebook every `make grade` adds to (`make grades`, `make feedback` read it).
COURSE ?= gradebook
JOBS ?=

.PHONY: help setup horovod lab lint test book labs grade grades report feedback check solutions bench soak clean release class-env classroom-test classroom-fairness

help:
	@echo "make lab    set up (first time only) and open JupyterLab on the course's start page"
	@echo "make setup  install what is missing: .venv (pinned packages; a CPU build of torch where there is"
	@echo "            no GPU), the course's packages, Horovod"
	@echo "make horovod   build Horovod (chapter 6, lab 6, chapter 8's horovodrun; once per machine; its first"
	@echo "            line says how long): make lab leaves it for then"
	@echo "make test   set up, run the linters (make lint), then the gate's tests (helpers, notebooks, each lab's"
	@echo "            reference, a correct answer and a mistake, one attacker per defence, the class, the"
	@echo "            website) and one shard of the full tier, chosen from the commit (CI runs this)"
	@echo "make test-full [SHARD=i/K]   both tiers whole (before a release, after touching the grader, the"
	@echo "            set-up or the class harness), or one shard of the full tier alone; the self-learner's"
	@echo "            install at full depth (every chapter and lab on the torch pip chooses)"
	@echo "make test-one T='tests/test_x.py::test_y'   one test (or file) alone, with the suite's options"
	@echo "make lint   the linters alone: ruff (code and notebooks) and mypy (src/, benchmarks/, examples/)"
	@echo "make labs   regenerate labs/ (student copies) from solutions/"
	@echo "make book   the course as a website in build/book/ (chapters with outputs, labs as released,"
	@echo "            search, offline): its own environment build/book-env (requirements-book.txt); book/hub.yml"
	@echo "make grade SUBMISSIONS=dir LAB=... [JOBS=N] [COURSE=gradebook] [OUT=grades.csv]"
	@echo "            autograde a folder of submissions, N at a time, sandboxed, into the course gradebook"
	@echo "            (SLURM=1 [SLURM_ARGS=\"--partition=P --account=A\"]: one SLURM task per student; again resumes)"
	@echo "make grades [COURSE=...] [OUT=course-grades.csv]   the whole course as one CSV"
	@echo "make report [COURSE=...] [OUT=build/report]   the instructor's report, one HTML page and PNG plots:"
	@echo "            per lab scores, test cells' pass rates, frequent failures, late; one line per student"
	@echo "make feedback [COURSE=...]   one HTML page per student and lab (hidden tests removed)"
	@echo "make check LAB=01-input-pipeline   run a lab as the grader would; exit 1 if a test fails"
	@echo "make solutions [SOLUTIONS_ARGS=--ci]   run every course and solution notebook on this"
	@echo "            machine's hardware; report in build/solutions/report.md (exit 1 on a failure)"
	@echo "make bench  run every benchmark side by side, print ratios vs goals, plots in build/bench/"
	@echo "make soak [SOAK_ARGS=...]   every kind of distributed launch, repeated under a CPU hog,"
	@echo "            plus a burst of 20; ends with 'soak: N launches, F failed' (about 30 min)"
	@echo "make cluster-test [CLUSTER_ARGS=--only torchrun]   bring up a two-node SLURM cluster here"
	@echo "            (root, slurm-wlm + munge), sbatch every slurm/ script on it, check, tear down"
	@echo "make class-env [PREFIX=/opt/dp-course] [PYTHON=/usr/bin/python3]   one course environment for"
	@echo "            every user of a node (a JupyterHub class): students' make lab/check use it, build nothing"
	@echo "make classroom-test [CLASSROOM_LAB=05-ring-allreduce|all] [CLASSROOM_ARGS=\"--students 3 --keep\"]"
	@echo "            a real JupyterHub class here (root, apt, npm): Chromium students, nbgrader, grading"
	@echo "            (SPAWNER=slurm: each student's server a SLURM job on a two-node cluster brought up here)"
	@echo "make classroom-fairness   a classmate's kernel round trip while lab 6 runs; a kernel past its memory limit"
	@echo "make release [OUT=dir]   the student release: folder, .tar.gz and git branch 'student',"
	@echo "            without solutions/, hidden tests or grading tools (default build/release/)"

setup:
	@bash src/dpc_setup/setup.sh

# JupyterLab opens without waiting for Horovod's build (chapter 6, lab 6, chapter 8's horovodrun):
# `make horovod` then.
lab:
	@DPC_HOROVOD=$${DPC_HOROVOD:-later} bash src/dpc_setup/setup.sh
	$(VENV)/bin/jupyter lab --ServerApp.root_dir=$(CURDIR) course/00-setup-and-devices.ipynb $(ROOT_FLAG) $(LAB_ARGS)

# The linters: ruff on the code and the notebooks, mypy on the packages (configured in pyproject.toml) and on
# the benchmark and example scripts, which are no package (so a stale name in them fails the gate).
lint: setup
	$(PY) -m ruff check .
	$(PY) -m mypy
	$(PY) -m mypy benchmarks examples

# The suite in two tiers (tests/tiers.py; README, "Testing"): every test is in the gate or the full tier.
# `make test` (CI) runs the gate and one of FULL_SHARDS shards of the full tier, chosen from the commit
# (git rev-list --count HEAD, mod FULL_SHARDS, plus 1): every full test runs once in FULL_SHARDS landings.
# `make test-full` runs both tiers whole; `make test-full SHARD=i/K` one shard of the full tier alone;
# `make test-one T=<node id>` one test (or one file, or a chapter's build/nbtest copy) alone.
# Test files run TEST_WORKERS at a time (pytest-xdist; a file's tests, and so its module fixtures
# and a notebook's cells, stay on one worker), handed out in tests/conftest.py's order (xdist's own
# reorder, most tests first, would leave the longest files, which have few tests, to the end).
# TEST_WORKERS=0: one process, in order.
TEST_WORKERS ?= 2
FULL_SHARDS := 4
SHARD ?=
T ?=
PYTEST := $(PY) -m pytest --nbval-lax --nbval-current-env --nbval-cell-timeout=300 \
  --nbval-sanitize-with tests/sanitize.cfg -p no:cacheprovider -rs
PYTEST_ALL := $(PYTEST) tests build/nbtest --durations=25 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder
COMMIT_SHARD = $$(( $$(git rev-list --count HEAD 2>/dev/null || echo 0) % $(FULL_SHARDS) + 1 ))/$(FULL_SHARDS)
.PHONY: test-full test-one test-durations test-system nbtest
# What every test target needs besides the .venv: the system's packages (Chromium too) ...
test-system: setup
	@DPC_SYSTEM_BROWSER=1 bash src/dpc_setup/system.sh
# ... and the chapters' copies with their CI parameters (build/nbtest/, src/dpc_maintainer/notebooks.py).
nbtest: test-system
	$(PY) -m dpc_maintainer.notebooks
test: setup lint nbtest
	@shard=$(COMMIT_SHARD); echo "test: the gate and shard $$shard of the full tier (this commit's: git rev-list --count HEAD mod $(FULL_SHARDS), plus 1)"; \
	  $(PYTEST_ALL) --tier gate --full-shard $$shard $(PYTEST_ARGS)

# The self-learner's stage at its full depth (tests/test_student_install.py): torch as a student's pip
# chooses it, every chapter and every lab; `make test`'s shard runs its short depth (ci).
test-full: setup lint nbtest
	DPC_STUDENT_INSTALL=$${DPC_STUDENT_INSTALL:-full} $(PYTEST_ALL) $(if $(SHARD),--tier full --full-shard $(SHARD),--tier all) $(PYTEST_ARGS)

test-one: $(if $(filter build/nbtest/%,$(T)),nbtest,test-system)
	@test -n "$(T)" || { echo "usage: make test-one T='tests/test_x.py::test_y' (a node id, a file, or build/nbtest/...)"; exit 2; }
	$(PYTEST) "$(T)" $(PYTEST_ARGS)

# The full tier's seconds per file, measured by running it alone (its module fixtures then grade only its
# students): tests/durations.json, from which its shards are cut. Rerun after adding a long full-tier file.
test-durations: test-system
	DPC_DURATIONS_OUT=tests/durations.json $(PYTEST_ALL) --tier full $(PYTEST_ARGS)

# Horovod, built from source with the course's patches (once per machine; src/dpc_setup/horovod/build.sh says how long):
# `make setup` and every other target build it too; `make lab` leaves it for chapter 6.
horovod:
	@DPC_HOROVOD=1 bash src/dpc_setup/setup.sh

# `make book [BOOK_ARGS="--out DIR"]`: the course as a static website in build/book/ (src/dpc_maintainer/book.py,
# book/conf.py; the hub link: book/hub.yml). It needs only its own environment, built once from BOOK_PYTHON with
# requirements-book.txt (Sphinx, MyST-NB, sphinx-book-theme, Playwright for tests/test_book.py), not `make setup`.
BOOK_ENV := build/book-env
BOOK_PYTHON ?= /usr/bin/python3
BOOK_ARGS ?=
$(BOOK_ENV)/.dpc-book: requirements-book.txt
	@command -v $(BOOK_PYTHON) >/dev/null || { echo "book: $(BOOK_PYTHON) not found (BOOK_PYTHON=another python3)"; exit 1; }
	@echo "book: building the site builder's environment $(BOOK_ENV) (requirements-book.txt)"
	@mkdir -p build && rm -rf $(BOOK_ENV) && $(BOOK_PYTHON) -m venv $(BOOK_ENV)
	@$(BOOK_ENV)/bin/python -m pip install -q -r requirements-book.txt >build/book-pip.log 2>&1 \
	  || { tail -n 20 build/book-pip.log; echo "book: pip install -r requirements-book.txt failed (build/book-pip.log)"; exit 1; }
	@touch $@
.PHONY: book-env
book-env: $(BOOK_ENV)/.dpc-book
book: $(BOOK_ENV)/.dpc-book
	@PYTHONPATH=$(CURDIR)/src $(BOOK_ENV)/bin/python -m dpc_maintainer.book $(BOOK_ARGS)

labs: setup
	$(PY) -m dpc_instructor.labs generate

grade: setup
	@test -n "$(SUBMISSIONS)" || { echo "usage: make grade SUBMISSIONS=dir [LAB=$(LAB)] [OUT=$(OUT)]"; exit 2; }
	$(PY) -m dpc_instructor.grade "$(SUBMISSIONS)" --lab "$(LAB)" --out "$(OUT)" --course "$(COURSE)" $(if $(JOBS),--jobs $(JOBS)) $(if $(DISK_MB),--disk-mb $(DISK_MB)) $(if $(PARAMETERS),--parameters $(PARAMETERS)) $(if $(SLURM),--slurm $(SLURM_ARGS))

grades: setup
	$(PY) -m dpc_instructor.gradebook export --course "$(COURSE)" --out "$(if $(filter command line,$(origin OUT)),$(OUT),course-grades.csv)"

# `make report [COURSE=gradebook] [OUT=build/report]`: OUT/index.html (src/dpc_instructor/report.py).
report: setup
	$(PY) -m dpc_instructor.report --course "$(COURSE)" --out "$(if $(filter command line,$(origin OUT)),$(OUT),build/report)"

feedback: setup
	$(PY) -m dpc_instructor.gradebook feedback --course "$(COURSE)"

# `make check LAB=01-input-pipeline [NB=labs/.../x.ipynb]`: a student's self-check (src/dpc_runtime/check.py).
check: setup
	$(PY) -m dpc_runtime.check "$(or $(NB),labs/$(LAB))"

# `make solutions [SOLUTIONS_ARGS="--ci --only 07"]`: every notebook of course.yml, executed
# with parameters for the hardware present (CPU, one GPU, several GPUs).
SOLUTIONS_ARGS ?=
solutions: setup
	$(PY) -m dpc_maintainer.solutions $(SOLUTIONS_ARGS)

# `make bench [BENCH_ARGS="--quick"]`: every benchmark, ratios vs goals; results in build/bench/.
BENCH_ARGS ?=
bench: setup
	$(PY) -m dpc_maintainer.run_all $(BENCH_ARGS)

# `make soak [SOAK_ARGS="--rounds 5 --only lab7"]`: launches under load; results in build/soak/.
SOAK_ARGS ?=
soak: setup
	$(PY) -m dpc_maintainer.soak $(SOAK_ARGS)

# `make release [OUT=build/release/dp-course-student] [PARENT=<published student repo>]`: what students
# get (src/dpc_instructor/release.py). The last word of its output is the folder written. OUT: the release folder.
release: setup
	$(PY) -m dpc_instructor.release $(if $(filter command line,$(origin OUT)),--out "$(OUT)") $(if $(PARENT),--parent "$(PARENT)")

# `make cluster-test [CLUSTER_ARGS="--only torchrun --keep"]`: a real two-node SLURM cluster on this
# machine (src/dpc_setup/cluster.py); every slurm/*.sbatch submitted on the CPU and checked; about 1.5 min.
.PHONY: cluster-test
CLUSTER_ARGS ?=
cluster-test: setup
	$(PY) -m dpc_setup.cluster test $(CLUSTER_ARGS)

# `make class-env [PREFIX=/opt/dp-course] [PYTHON=/usr/bin/python3]`: the environment of a class on one
# node, readable and runnable by every user (src/dpc_setup/class_env.sh; the guide's book/guide/class-env.md).
.PHONY: class-env
PREFIX ?= /opt/dp-course
class-env:
	@bash src/dpc_setup/class_env.sh "$(PREFIX)"

# What runs wrote; never a gradebook: the default one (gradebook/) is not under build/, and one that an
# earlier COURSE= put there stops the clean (move it out first).
clean:
	@kept=$$(find build -name gradebook.db -printf '%h ' 2>/dev/null); \
	  if [ -n "$$kept" ]; then echo "clean: build/ holds a gradebook ($$kept): nothing removed; move it out of build/ (or export it: make grades COURSE=...) and clean again"; exit 1; fi
	rm -rf build course/runs solutions/*/runs

# `make classroom-test [CLASSROOM_LAB=05-ring-allreduce|all] [SPAWNER=slurm] [CLASSROOM_ARGS="--students 3 --keep"]`:
# a real JupyterHub class on this machine (src/dpc_maintainer/classroom/; root, apt, npm): students in Chromium,
# (SPAWNER=slurm: each student's server a SLURM job on a two-node cluster brought up here, graded over SLURM),
# nbgrader's exchange, the course's grader, feedback, tear-down; prints a timeline, screenshots in build/classroom/.
# Ctrl-C or `kill -TERM` tears the run down; if it was killed outright, its guardian does. To clean by hand
# (after --keep, or a machine that rebooted mid-run): `make classroom-test CLASSROOM_ARGS=--clean`.
.PHONY: classroom-test
CLASSROOM_LAB ?= 05-ring-allreduce
CLASSROOM_ARGS ?=
SPAWNER ?=
classroom-test: setup
	$(PY) -m dpc_maintainer.classroom --lab "$(CLASSROOM_LAB)" $(if $(SPAWNER),--spawner $(SPAWNER)) $(CLASSROOM_ARGS)

# `make classroom-fairness [CLASSROOM_ARGS=...]`: the same class up, then one student runs lab 6 (TensorFlow
# and Horovod ranks) while a classmate's kernel round trip is timed (idle vs busy, median and max), and
# that kernel allocates past its memory limit: it must be killed alone. Prints the lines; not in make test.
.PHONY: classroom-fairness
classroom-fairness: setup
	$(PY) -m dpc_maintainer.classroom --fairness --lab 06-horovod $(CLASSROOM_ARGS)
