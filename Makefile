# The two commands a new user types: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck install clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q -U pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev,hidden]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/draftdata demo --out demo-out

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

# The heavy tiers' environments (vLLM CPU, the drafter trainers, SGLang CPU; minutes to build)
# live outside the clone, keyed on their inputs (scripts/env_path.sh), so clones, worktrees and
# CI on one machine share them. make test builds them in the background, one pip at a time, while the main
# venv installs and the main suite runs; their tiers run last and wait for the builds (flock).
VLLM_VENV := $(shell scripts/env_path.sh vllm)
TRAINERS_VENV := $(shell scripts/env_path.sh trainers)
SGLANG_VENV := $(shell scripts/env_path.sh sglang)
export DRAFTDATA_VLLM_VENV ?= $(VLLM_VENV)
export DRAFTDATA_TRAINERS_VENV ?= $(TRAINERS_VENV)
export DRAFTDATA_SGLANG_VENV ?= $(SGLANG_VENV)

# The main suite runs on TEST_WORKERS pytest-xdist workers: auto (one per CPU), a number, or 0
# for one process (make test TEST_WORKERS=0). Tests are dealt out by module (--dist loadscope),
# so a module's fixtures (a simulated fleet, a model built once) start once. The heavy tiers
# run serially: each starts real engines that want the whole machine.
TEST_WORKERS ?= auto
XDIST := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadscope)

test: heavy-envs-bg $(STAMP) lint typecheck
	$(BIN)/python -m pytest -q $(XDIST) --durations=25 --ignore=tests/integration/vllm \
		--ignore=tests/integration/trainers --ignore=tests/integration/sglang
	$(BIN)/python -m pytest -q tests/integration/vllm
	$(BIN)/python -m pytest -q tests/integration/trainers
	$(BIN)/python -m pytest -q tests/integration/sglang

.PHONY: heavy-envs-bg vllm-env trainers-env sglang-env
heavy-envs-bg:
	@mkdir -p $(dir $(DRAFTDATA_VLLM_VENV))
	@( (PY=$(PY) scripts/vllm_env.sh $(DRAFTDATA_VLLM_VENV); \
	    PY=$(PY) scripts/trainers_env.sh $(DRAFTDATA_TRAINERS_VENV); \
	    PY=$(PY) scripts/sglang_env.sh $(DRAFTDATA_SGLANG_VENV)) \
		>$(dir $(DRAFTDATA_VLLM_VENV))build-$(notdir $(DRAFTDATA_VLLM_VENV)).out 2>&1 & )

# Build one environment in the foreground (the tier's tests call the same scripts).
vllm-env:
	PY=$(PY) scripts/vllm_env.sh $(DRAFTDATA_VLLM_VENV)

trainers-env:
	PY=$(PY) scripts/trainers_env.sh $(DRAFTDATA_TRAINERS_VENV)

sglang-env:
	PY=$(PY) scripts/sglang_env.sh $(DRAFTDATA_SGLANG_VENV)

clean:
	rm -rf $(VENV) demo-out .mypy_cache .ruff_cache .pytest_cache
