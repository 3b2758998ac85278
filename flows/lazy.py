"""Classes named ``module:class``, their module imported when first asked for: a few of the
dependencies (the providers' SDKs, ``prefect_aws`` with botocore) cost every process half a
second to a second of CPU as it starts, which `runledger --help`, every CLI call and every flow
run would otherwise pay without using them."""

from __future__ import annotations

import importlib
from typing import Any


def loaded(path: str) -> Any:
    """The class that ``module:class`` names, its module imported if it is not yet."""
    module, name = path.split(":")
    return getattr(importlib.import_module(module), name)
