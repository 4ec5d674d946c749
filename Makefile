# Set-up and the main jobs. On these machines torch comes from a local CPU wheel pinned below;
# pyproject.toml states the real supported range.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_PIN ?= torch==2.13.0
NPROC ?= 2

.PHONY: install demo test bench clean

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_PIN)"
	$(PY) -m pip install --quiet -e ".[s3,tensorboard,mlflow,bench,test]"
	touch $@

install: $(VENV)/.installed

demo: install
	$(PY) launch/run.py --nproc-per-node $(NPROC) --config configs/per_rank.yaml

test: install
	$(PY) -m pytest -n auto -q

bench: install
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) runs buckets .pytest_cache
