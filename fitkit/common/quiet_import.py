"""Importing a dependency that imports `tqdm.auto` on its way (Lightning, torchmetrics through
transformers) without tqdm's notebook note ("IProgress not found"): fitkit draws its own display,
so the note is noise in a notebook without ipywidgets. Only while importing: a tqdm the user
imports later still warns::

    torchmetrics = quiet_import("torchmetrics")
"""

from __future__ import annotations

import importlib
import warnings
from types import ModuleType


def quiet_import(name: str) -> ModuleType:
    """`importlib.import_module(name)` with tqdm's notebook note silenced during the import."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found", module=r"tqdm\.")
        return importlib.import_module(name)
