# CUDA image of the suite for GPU hosts (run with `docker run --gpus all`): the PyPI torch 2.13.0 wheel brings its own
# CUDA runtime; the host's NVIDIA driver comes in through the NVIDIA container toolkit. Never built: no Docker
# engine was available (docs/validation.md).
#   docker build -t specter-suite .
#   docker run --gpus all -v "$PWD/results:/suite/results" specter-suite snakemake --cores all
FROM python:3.11-slim-bookworm

ENV PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1 GPTQMODEL_CPU_WORKERS=2
RUN apt-get update && apt-get install -y --no-install-recommends git && rm -rf /var/lib/apt/lists/*
WORKDIR /suite
COPY pyproject.toml constraints.txt requirements-nodeps.txt README.md ./
COPY specter/ specter/
COPY baselines/ baselines/
RUN python -m pip install -c constraints.txt -e ".[test]" && python -m pip install --no-deps -r requirements-nodeps.txt
COPY . .
CMD ["snakemake", "--cores", "all"]
