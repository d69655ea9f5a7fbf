# Everything a fresh machine needs goes through these targets: they create .venv and
# install what is missing (the stamp file is rebuilt when pyproject.toml changes).
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/psoup demo

# The kernels' numpy twins run the kernel and differential tests first (numba never
# imported by the engine), then the whole suite on the compiled kernels.
test: $(STAMP)
	$(BIN)/ruff check psoup tests bench
	$(BIN)/mypy
	PSOUP_KERNELS=numpy $(BIN)/python -m pytest -q -p no:cacheprovider \
		tests/test_kernels.py tests/test_differential.py
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/psoup bench all

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis bench/results/*.json bench/results/*.png
