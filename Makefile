# vfm: two commands on a fresh machine —  make demo  and  make test
PY      ?= python3.11
VENV    ?= .venv
BIN      = $(VENV)/bin
STAMP    = $(VENV)/.installed
export VFM_DATA_DIR ?= $(CURDIR)/data
export HF_HUB_OFFLINE = 1
export PREFECT_HOME ?= $(CURDIR)/data/prefect
export PREFECT_SERVER_ANALYTICS_ENABLED = false
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS ?= 90

# two xdist workers (this machine has 2 cores), whole files per worker, slowest files first
# (tests/conftest.py); PYTEST_WORKERS= runs in one process
PYTEST_WORKERS ?= -n 2 --dist loadscope

.PHONY: venv demo finetune test lint bench clean up down status deploy

venv: $(STAMP)
$(STAMP): pyproject.toml
	@command -v $(PY) >/dev/null || { echo "need $(PY) on PATH"; exit 1; }
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	# torch==2.13.0 is pinned in pyproject (CPU build); check the log for a CUDA torch download
	@echo "installing vfm and its dependencies into $(VENV) (a few minutes; full log: $(VENV)/install.log)"
	$(BIN)/python infra/pip_progress.py $(VENV)/install.log -- \
	  $(BIN)/pip install --progress-bar off -e '.[dev,video,text,s3,ray]'
	@! grep -qiE 'nvidia-|torch-2\.1[4-9]' $(VENV)/install.log || { echo "a CUDA torch was pulled in"; exit 1; }
	@mkdir -p $(PREFECT_HOME)
	$(BIN)/python -c "import torch, prefect, mlflow; print('torch', torch.__version__)"
	touch $(STAMP)

FAMILY  ?= diffusion
demo: venv   # make demo FAMILY=autoregressive: discrete tokenizer + ar-tiny instead of the DiT
	@mkdir -p $(VFM_DATA_DIR) $(PREFECT_HOME)
	VFM_DEMO_FAMILY=$(FAMILY) $(BIN)/python -m flows.demo

finetune: venv   # after make demo: LoRA / full fine-tuning / from scratch on a new colour
	@mkdir -p $(VFM_DATA_DIR) $(PREFECT_HOME)
	$(BIN)/python -m flows.finetune

test: venv
	$(BIN)/ruff check vfm_core flows tasks tests benchmarks infra
	$(BIN)/ruff format --check vfm_core flows tasks tests benchmarks infra
	$(BIN)/python -m pytest -q --durations=40 $(PYTEST_WORKERS)

lint: venv   # ruff (the formatter decides layout), the layering contract (tests/test_layering.py)
	$(BIN)/ruff check vfm_core flows tasks tests benchmarks infra
	$(BIN)/ruff format --check vfm_core flows tasks tests benchmarks infra
	$(BIN)/python -m pytest -q tests/test_layering.py

bench: venv
	$(BIN)/python benchmarks/train_step.py

up: venv     # Prefect server + worker, MLflow server, S3 endpoint on 127.0.0.1 (infra/services.py)
	$(BIN)/python infra/services.py up

down:
	$(BIN)/python infra/services.py down

status:
	$(BIN)/python infra/services.py status

deploy: venv  # register deployments/prefect.yaml with the server started by `make up`
	$(BIN)/python infra/services.py status >/dev/null || { echo "servers not running: run make up"; exit 1; }
	. $(VFM_DATA_DIR)/infra/env.sh && $(BIN)/prefect --no-prompt deploy --all --prefect-file deployments/prefect.yaml

clean:
	rm -rf data runs .pytest_cache
