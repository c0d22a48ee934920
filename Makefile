# make demo: the main job on the default BERT.  make test: every test in both TVM environments.
SHELL := /bin/bash
PYTHON311 ?= python3
# pyenv's shim answers for python3.10 only where 3.10 is the active version: fall back to its folder.
PYTHON310 ?= $(shell python3.10 -c 'import sys; print(sys.executable)' 2>/dev/null || ls -d $$HOME/.pyenv/versions/3.10*/bin/python3.10 2>/dev/null | tail -n 1)
VENV := .venv
VENV_RELAY := .venv-relay

.PHONY: demo test test-main test-relay bench lint clean fuzz

# Extras (pyproject.toml): the demo needs relax and models only; the tests add the rest.
MAIN_EXTRAS := relax,models,mpi,nccl,tune,test,dev
RELAY_EXTRAS := relay,models,mpi,test

$(VENV)/.installed-demo: pyproject.toml requirements/constraints-main.txt
	test -x $(VENV)/bin/python || $(PYTHON311) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e ".[relax,models]" -c requirements/constraints-main.txt
	touch $@

$(VENV)/.installed: $(VENV)/.installed-demo
	$(VENV)/bin/pip install -q -e ".[$(MAIN_EXTRAS)]" -c requirements/constraints-main.txt
	touch $@

$(VENV_RELAY)/.installed: pyproject.toml requirements/constraints-relay.txt
	@test -n "$(PYTHON310)" || { echo "python3.10 not found: the Relay environment needs it" >&2; exit 1; }
	test -x $(VENV_RELAY)/bin/python || $(PYTHON310) -m venv $(VENV_RELAY)
	$(VENV_RELAY)/bin/pip install -q --upgrade pip
	$(VENV_RELAY)/bin/pip install -q -e ".[$(RELAY_EXTRAS)]" -c requirements/constraints-relay.txt
	touch $@

demo: $(VENV)/.installed-demo
	$(VENV)/bin/tvm-combiners run --target llvm --ir relax --batch 1 --seq 128

# The two suites run side by side (each keeps about one core busy); TEST_SERIAL=1 runs one after the other.
# The Relay suite is the shorter, so MAIN_SECOND (files of the main suite) runs after it in its job,
# leaving both jobs about as long. Its output is kept in $(RELAY_LOG) and printed when both are done.
RELAY_LOG := .pytest-relay.log
MAIN_SECOND := tests/test_benchmarks.py tests/test_tune.py tests/test_cli.py
PYTEST_MAIN := $(VENV)/bin/python -m pytest -q --durations=15 tests --ignore=tests/relay
test: $(VENV)/.installed $(VENV_RELAY)/.installed
	@status=0; \
	if [ -n "$(TEST_SERIAL)" ]; then \
	  $(MAKE) --no-print-directory test-main || status=1; \
	  $(MAKE) --no-print-directory test-relay || status=1; \
	else \
	  echo "make test: the Relay suite, then $(MAIN_SECOND), run beside the rest (their output follows when all are done)"; \
	  { $(MAKE) --no-print-directory test-relay; r=$$?; \
	    echo "----- .venv: $(MAIN_SECOND) -----"; \
	    $(VENV)/bin/python -m pytest -q --durations=5 $(MAIN_SECOND) || r=1; exit $$r; } > $(RELAY_LOG) 2>&1 & second=$$!; \
	  trap 'kill $$second 2>/dev/null' INT TERM; \
	  $(VENV)/bin/ruff check . || status=1; \
	  $(PYTEST_MAIN) $(addprefix --ignore=,$(MAIN_SECOND)) || status=1; \
	  wait $$second || status=1; \
	  echo "----- Relay environment (tests/relay) -----"; cat $(RELAY_LOG); \
	fi; \
	exit $$status

test-main: $(VENV)/.installed
	$(VENV)/bin/ruff check .
	$(PYTEST_MAIN)

test-relay: $(VENV_RELAY)/.installed
	$(VENV_RELAY)/bin/python -m pytest -q --durations=15 tests/relay

bench: $(VENV)/.installed $(VENV_RELAY)/.installed
	$(VENV)/bin/python benchmarks/bench_combiners.py
	$(VENV)/bin/python benchmarks/bench_pass_scaling.py
	$(VENV)/bin/python benchmarks/bench_cpu_schedules.py
	$(VENV)/bin/python benchmarks/bench_models.py
	$(VENV)/bin/python benchmarks/bench_collectives.py
	$(VENV)/bin/python benchmarks/bench_collective_combiners.py
	$(VENV)/bin/python benchmarks/bench_collective_pass_scaling.py
	$(VENV)/bin/python benchmarks/bench_tuned.py --trials $(or $(TUNE_TRIALS),64)

# Differential fuzzing (not in CI's budget): FUZZ_EXAMPLES modules per pass family (op combiners: each of
# 1-5 graphs) and per collective-combiner setting (9 settings). Defaults measured on 2 cores: Relax 400
# (~15 min for the op combiners, ~20 min for the collective combiners, ~13 min for their 2-rank run:
# FUZZ_EXAMPLES programs x 9 settings; FUZZ_RANKS=3 for a real ring), Relay 150 (~35 min for the op
# combiners; the collective combiners' 150 are spread over 4 form/order targets; ~25 min on 2 ranks).
fuzz: $(VENV)/.installed $(VENV_RELAY)/.installed
	@status=0; \
	FUZZ_EXAMPLES=$(or $(FUZZ_EXAMPLES),400) $(VENV)/bin/python -m pytest -q --tb=short -p no:cacheprovider tests/fuzz || status=1; \
	FUZZ_EXAMPLES=$(or $(FUZZ_EXAMPLES_RELAY),$(FUZZ_EXAMPLES),150) $(VENV_RELAY)/bin/python -m pytest -q --tb=short -p no:cacheprovider tests/relay/fuzz || status=1; \
	exit $$status

lint: $(VENV)/.installed
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) $(VENV_RELAY) *.egg-info .pytest_cache .hypothesis $(RELAY_LOG)
