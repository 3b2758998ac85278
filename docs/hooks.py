"""mkdocs hooks: add the generated reference pages (docs/gen_reference.py) to every build, so
they are made from the code each time and never committed; put CHANGELOG.md into the changelog
page with its links to pages made relative to docs/."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

from mkdocs.structure.files import File, Files
from mkdocs.structure.pages import Page

HERE = Path(__file__).resolve().parent
CHANGELOG_PAGE = "changelog.md"
# CHANGELOG.md is read at the repository's root too (GitHub, an editor), so it links pages as
# docs/how-to/revise.md; on the site the changelog page is docs/changelog.md, beside them.
ROOT_LINK = re.compile(r"\]\(docs/")


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


def on_page_markdown(markdown: str, page: Page, config: Any, files: Files) -> str:
    """The changelog page is CHANGELOG.md, its ``docs/...`` links made relative to docs/."""
    if page.file.src_uri != CHANGELOG_PAGE:
        return markdown
    return ROOT_LINK.sub("](", (HERE.parent / "CHANGELOG.md").read_text(encoding="utf-8"))
