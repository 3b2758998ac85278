"""mkdocs hook: adds the generated reference pages (docs/gen_reference.py) to every build, so
they are made from the code each time and never committed."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from mkdocs.structure.files import File, Files

HERE = Path(__file__).resolve().parent


def _generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_reference", HERE / "gen_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def on_files(files: Files, config: Any) -> Files:
    for path, text in _generator().pages().items():
        files.append(File.generated(config, path, content=text))
    return files
