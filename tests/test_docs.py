"""The documentation site builds with `mkdocs build --strict` (what `make docs` runs): a broken
link, a page missing from the navigation or an API reference that does not resolve fails."""

import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REASON = 'the docs toolchain is not installed: pip install -e ".[docs]" (or make docs)'

for _module in ("mkdocs", "material", "mkdocstrings", "mkdocstrings_handlers.python", "yaml"):
    pytest.importorskip(_module, reason=REASON)


def _build(config: str, site: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", config,
                           "--site-dir", site],
                          cwd=ROOT, capture_output=True, text=True, timeout=120, env=env, check=False)


def test_strict_build_of_the_site(tmp_path):
    site = tmp_path / "site"
    proc = _build(os.path.join(ROOT, "mkdocs.yml"), str(site))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for page in ("quickstart", "concepts", "callbacks", "display", "checkpoints", "search", "scaling", "tracking",
                 "benchmarks", "migrating-from-hf", "migrating-from-keras", "api"):
        assert (site / page / "index.html").is_file(), page
    api = (site / "api" / "index.html").read_text()
    # generated from the docstrings: the facade's methods and the callbacks' signatures are there
    for anchor in ('id="fitkit.Model.fit"', 'id="fitkit.Model.hyperparameter_search"',
                   'id="fitkit.callbacks.History.plot"', 'id="fitkit.callbacks.ProgressBar"'):
        assert anchor in api, anchor
    assert "Total params" in (site / "display" / "index.html").read_text()


def test_strict_build_fails_on_a_broken_link(tmp_path):
    import yaml

    docs = tmp_path / "docs"
    shutil.copytree(os.path.join(ROOT, "docs"), docs)
    with open(docs / "quickstart.md", "a") as f:
        f.write("\nSee [the missing page](no-such-page.md).\n")
    with open(os.path.join(ROOT, "mkdocs.yml")) as f:
        config = yaml.safe_load(f)
    config["docs_dir"] = str(docs)
    config["plugins"][1]["mkdocstrings"]["handlers"]["python"]["paths"] = [ROOT]
    path = tmp_path / "mkdocs.yml"
    path.write_text(yaml.safe_dump(config))
    proc = _build(str(path), str(tmp_path / "site"))
    assert proc.returncode != 0
    assert "no-such-page.md" in proc.stdout + proc.stderr
