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

test: $(STAMP)
	$(BIN)/ruff check psoup tests bench
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/psoup bench all

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis bench/results/*.json bench/results/*.png
