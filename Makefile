# Set-up and the main jobs. On these machines torch comes from a local CPU wheel pinned below;
# pyproject.toml states the real supported range.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_PIN ?= torch==2.13.0
NPROC ?= 2
EXTRAS ?= s3,tensorboard,mlflow,bench,fsspec,wandb,lightning,transformers,accelerate,comet,neptune,system,prometheus,test,lint

.PHONY: install system-packages demo test lint bench clean

$(VENV)/.installed: pyproject.toml Makefile setup.py dist_logging/stragglers/_csections.c
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet "$(TORCH_PIN)"
	$(PY) -m pip install --quiet "$(TORCH_PIN)" -e ".[$(EXTRAS)]"
	touch $@

install: $(VENV)/.installed system-packages

# What the real-launcher tests start (tests/multiprocess/test_launchers.py): Debian's SLURM, munge and
# Open MPI; and the Prometheus server the telemetry tests scrape with (tests/telemetry/).
# Installed only as root, only when missing; never fails the install (the tests skip, saying why).
SYSTEM_PACKAGES ?= slurm-wlm munge openmpi-bin prometheus
system-packages:
	@if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && \
	    ! { command -v slurmctld && command -v slurmd && command -v munged && command -v mpirun && \
	        command -v prometheus; } >/dev/null 2>&1; then \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $(SYSTEM_PACKAGES); } \
	    || echo 'make: could not install $(SYSTEM_PACKAGES): the SLURM/MPI/Prometheus tests will skip'; \
	fi

demo: install
	$(PY) launch/run.py --nproc-per-node $(NPROC) --config configs/per_rank.yaml

# Two tiers: everything else in parallel, then the tests that launch a framework's real
# multi-process job (Lightning, HF Trainer, Accelerate), one at a time with one thread each.
# --dist loadgroup: tests sharing an expensive module fixture (one torchrun launch, a SLURM cluster) carry
# an xdist_group mark and run on one worker, so that set-up happens once; every other test is handed out
# one at a time, the multi-process ones first (tests/conftest.py), so no long test starts last.
test: install
	$(PY) -m pytest -n auto --dist loadgroup -q -m "not serial" --durations=15
	OMP_NUM_THREADS=1 $(PY) -m pytest -p no:xdist -q -m serial || test $$? -eq 5  # 5: no serial test selected

# Lint: ruff's rules and its format check on the package, the tests, the benchmarks and launch/; mypy (on the
# package) at the strictness pyproject.toml documents ([tool.ruff], [tool.mypy]).
lint: install
	$(PY) -m ruff check dist_logging tests benchmarks launch
	$(PY) -m ruff format --check dist_logging tests benchmarks launch
	$(PY) -m mypy

bench: install
	$(PY) benchmarks/run_all.py

clean:
	rm -rf $(VENV) .venv-mlflow-lowest .venv-mlflow-lowest.lock runs buckets .pytest_cache build dist_logging/stragglers/_csections*.so
