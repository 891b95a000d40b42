"""The built wheel carries what a published package should: the type-hint marker (PEP 561
`fitkit/py.typed`), the license text, and the license expression in its metadata.

The wheel is built from a copy of the sources in a temporary folder (so that no `build/` or
`*.egg-info` lands in the checkout, and no stale `build/lib` from an earlier build can leak into
it), without build isolation (offline, a few seconds: setuptools comes with the venv, as torch requires it).
"""

from __future__ import annotations

import email.parser
import pathlib
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# the build backend (pyproject.toml's build-system), used from this environment: 77 reads
# `license-files` (PEP 639) and builds wheels without the separate `wheel` package
pytest.importorskip("setuptools", minversion="77", reason="building the wheel without isolation needs setuptools>=77")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Iterator[zipfile.ZipFile]:
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    shutil.copytree(ROOT / "fitkit", src / "fitkit", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "--no-index",
         "-w", str(out), str(src)],
        check=True,
        cwd=src,
    )
    (built,) = out.glob("fitkit-*.whl")
    with zipfile.ZipFile(built) as archive:
        yield archive


def _dist_info(archive: zipfile.ZipFile) -> str:
    (name,) = {n.split("/", 1)[0] for n in archive.namelist() if n.split("/", 1)[0].endswith(".dist-info")}
    return name


def test_wheel_ships_py_typed(wheel):
    assert "fitkit/py.typed" in wheel.namelist()


def test_wheel_ships_the_license(wheel):
    names = wheel.namelist()
    licenses = [n for n in names if n.startswith(_dist_info(wheel) + "/") and n.rsplit("/", 1)[-1] == "LICENSE"]
    assert licenses, f"no LICENSE in the wheel's dist-info: {sorted(names)}"
    text = wheel.read(licenses[0]).decode()
    assert "Apache License" in text and "Version 2.0, January 2004" in text
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text
    assert text == (ROOT / "LICENSE").read_text()


def test_wheel_metadata_declares_apache_2(wheel):
    metadata = email.parser.Parser().parsestr(wheel.read(_dist_info(wheel) + "/METADATA").decode())
    assert metadata["License-Expression"] == "Apache-2.0"
    assert "LICENSE" in metadata.get_all("License-File", [])
