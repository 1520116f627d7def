# The two commands a new user types: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint typecheck unit install clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q -U pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/draftdata demo --out demo-out

lint: $(STAMP)
	$(BIN)/ruff check src tests benchmarks
	$(BIN)/ruff format --check src tests benchmarks

typecheck: $(STAMP)
	$(BIN)/mypy

# The vLLM CPU and the trainers' environments (minutes to build) are built in the background
# while the main venv installs and the main suite runs; their tiers run last and wait for the
# builds (flock). The trainers' build waits for the vLLM one (one pip at a time on a small box).
test: vllm-env-bg trainers-env-bg $(STAMP) lint typecheck
	$(BIN)/python -m pytest -q --ignore=tests/integration/vllm --ignore=tests/integration/trainers
	$(BIN)/python -m pytest -q tests/integration/vllm
	$(BIN)/python -m pytest -q tests/integration/trainers

.PHONY: vllm-env-bg
vllm-env-bg:
	@mkdir -p .venv-vllm
	@(PY=$(PY) scripts/vllm_env.sh .venv-vllm >.venv-vllm/build.out 2>&1 &)

# The cached CPU vLLM environment of the real-engine test tier (tests/integration/vllm).
.PHONY: vllm-env
vllm-env:
	PY=$(PY) scripts/vllm_env.sh .venv-vllm

# The drafter trainers' environment (SpecForge, speculators; CPU torch) of the trainer tier
# (tests/integration/trainers): scripts/trainers_env.sh, cached by a stamp file.
.PHONY: trainers-env trainers-env-bg
trainers-env:
	PY=$(PY) scripts/trainers_env.sh .venv-trainers

trainers-env-bg:
	@mkdir -p .venv-trainers
	@( (flock .venv-vllm/.lock true 2>/dev/null; PY=$(PY) scripts/trainers_env.sh .venv-trainers) \
		>.venv-trainers/build.out 2>&1 & )

clean:
	rm -rf $(VENV) demo-out .mypy_cache .ruff_cache .pytest_cache
