# Two commands set everything up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin

.PHONY: install browser demo test test-fast bench lint clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $@

install: $(VENV)/.installed

demo: install
	$(BIN)/llmload demo

# headless Chromium (Debian's package) for the HTML report test; without root it is skipped, and says so
browser:
	@command -v chromium >/dev/null || { [ "$$(id -u)" = 0 ] && apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; } || \
	  echo "make: no chromium and not root: the HTML report rendering test will be skipped"

# everything, the real-vLLM end-to-end tests included (first run builds their venv: ~3 min, 3.5 GB)
test: install lint browser
	$(BIN)/pytest

# without the real vLLM (prints that it skipped them)
test-fast: install
	LLMLOAD_SKIP_VLLM=1 $(BIN)/pytest

bench: install
	$(BIN)/python -m benchmarks

lint: install
	$(BIN)/ruff check llmload loadtests tests benchmarks
	$(BIN)/ruff format --check llmload loadtests tests benchmarks
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .mypy_cache
