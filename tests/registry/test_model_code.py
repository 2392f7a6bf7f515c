"""The registry names the models-from-code file it logs by path (the registry never imports the
inference package): that path is the module which sets the generation pyfunc as the model."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

from vfm_core.registry.register import MODEL_CODE


def test_model_code_is_the_inference_pyfunc_module():
    spec = importlib.util.find_spec("vfm_core.infer.model_code")
    assert spec is not None and spec.origin is not None
    assert MODEL_CODE.is_file() and MODEL_CODE == Path(spec.origin).resolve()
    imports = [
        n for n in ast.walk(ast.parse(MODEL_CODE.read_text())) if isinstance(n, ast.ImportFrom)
    ]
    assert any(n.module == "vfm_core.infer.pyfunc" for n in imports)
