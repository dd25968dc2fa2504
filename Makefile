# The README's two commands: `make run` (the main job) and `make test`.
# Both build everything they need from nothing: a .venv, torch==2.13.0 (the CPU wheel on this
# machine's disk; any torch >= 2.4 works), and this package installed editable with its extras.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
TORCH  ?= torch==2.13.0
# Every other dependency at the version CI last passed with (`make lock` refreshes it).
CONSTRAINTS ?= constraints/test.txt
STAMP  := $(VENV)/.installed

SGLANG_CONSTRAINTS ?= constraints/sglang.txt
# SGLang 0.5.23's Triton kernel files (60 KiB of its wheel), for the tests that run them on the CPU
# under Triton's interpreter; without the index they skip, saying why.
SGLANG_KERNELS ?= .kdtree-cache/sglang-kernels

.PHONY: run test test-fast venv clean status lock lock-sglang sglang-kernels

$(STAMP): pyproject.toml $(CONSTRAINTS)
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip setuptools wheel
	$(PIP) install -q "$(TORCH)"
	$(PIP) install -q -c $(CONSTRAINTS) -e ".[test]"
	touch $(STAMP)

venv: $(STAMP)

## run: the main job - `orchestrate run phase1` on whatever device this machine has.
# Exit 3 means "incomplete": some gates were skipped because this machine lacks what they need
# (a CUDA GPU); that is this machine's limit, not a failure, so `make run` reports it and succeeds.
run: $(STAMP)
	@$(VENV)/bin/orchestrate run phase1 --device auto; rc=$$?; \
	if [ $$rc -eq 3 ]; then echo "phase1 is incomplete here: its GPU gates need a CUDA device (see orchestrate status)"; \
	elif [ $$rc -ne 0 ]; then exit $$rc; fi

## sglang-kernels: SGLang's Triton kernel files into $(SGLANG_KERNELS) (never fails the build).
sglang-kernels:
	@$(PYTHON) scripts/fetch-sglang-kernels.py $(SGLANG_KERNELS) || echo "(the tests that run SGLang's kernels will skip)"

## test: the whole test suite (GPU tests skip with their reason on a machine without one).
test: $(STAMP) sglang-kernels
	$(PY) -m pytest -q

## test-fast: the inner loop - every test not marked `slow` (under 3 minutes on 2 CPU cores).
# CI runs `make test`, the whole suite; mark a test `@pytest.mark.slow` when it takes seconds.
test-fast: $(STAMP)
	$(PY) -m pytest -q -m "not slow"

status: $(STAMP)
	$(VENV)/bin/orchestrate status

## lock: resolve the test extras afresh (newest releases) into $(CONSTRAINTS); run `make test` after.
lock:
	rm -rf .venv-lock
	$(PYTHON) -m venv .venv-lock
	.venv-lock/bin/python -m pip install -q --upgrade pip setuptools wheel
	.venv-lock/bin/python -m pip install -q "$(TORCH)"
	.venv-lock/bin/python -m pip install -q -e ".[test]"
	{ sed -n '/^#/p' $(CONSTRAINTS); .venv-lock/bin/python -m pip freeze --exclude-editable \
	  | grep -v -i -E '^(torch|triton|kdtree)'; } > $(CONSTRAINTS).tmp && mv $(CONSTRAINTS).tmp $(CONSTRAINTS)
	rm -rf .venv-lock

## lock-sglang: resolve the sglang and test extras together (pip --dry-run against the index, nothing
# installed) into $(SGLANG_CONSTRAINTS), for `pip install ".[sglang]" -c $(SGLANG_CONSTRAINTS)`.
lock-sglang: $(STAMP)
	report=$$(mktemp) && $(PIP) install -q --dry-run --ignore-installed --report $$report ".[test,sglang]" && \
	{ sed -n '/^#/p' $(SGLANG_CONSTRAINTS); $(PY) -c 'import json, sys; r = json.load(open(sys.argv[1])); \
	  print("\n".join(sorted("%s==%s" % (i["metadata"]["name"], i["metadata"]["version"]) \
	  for i in r["install"] if i["metadata"]["name"] != "kdtree-engine")))' $$report; } \
	  > $(SGLANG_CONSTRAINTS).tmp && mv $(SGLANG_CONSTRAINTS).tmp $(SGLANG_CONSTRAINTS); rm -f $$report

clean:
	rm -rf $(VENV) build dist *.egg-info
