"""CodeCarbonCallback: emissions measured offline and added to the final record."""

import csv
import math

import pytest
from helpers import mlp

pytest.importorskip("codecarbon")

from fitkit import Model
from fitkit.integrations import CodeCarbonCallback


@pytest.fixture(autouse=True)
def _env(monkeypatch):
    monkeypatch.delenv("CODECARBON_COUNTRY_ISO_CODE", raising=False)


def _read(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_emissions_reach_the_final_record_and_codecarbons_csv(tmp_path, blobs):
    x, y = blobs
    model = Model(mlp()).compile("adam", "cross_entropy")
    model.fit(x, y, epochs=2, batch_size=60, validation_split=0.25, verbose=0, output_dir=str(tmp_path),
              report_to=["codecarbon", "csv"])
    final = model.state.log_history[-1]
    assert "train_runtime" in final and final["step"] == model.state.global_step  # merged into the closing record
    assert math.isfinite(final["emissions"]) and final["emissions"] > 0
    assert final["energy_consumed"] > 0
    assert final["emissions_rate"] > 0
    rows = _read(tmp_path / "emissions.csv")  # codecarbon's own output
    assert len(rows) == 1
    assert float(rows[0]["emissions"]) == pytest.approx(final["emissions"], rel=1e-9)
    assert float(rows[0]["energy_consumed"]) == pytest.approx(final["energy_consumed"], rel=1e-9)
    assert rows[0]["country_iso_code"] == "USA"
    # the CSV step logger wrote the figures into the final row
    last = _read(tmp_path / "logs.csv")[-1]
    assert float(last["emissions"]) == final["emissions"] and float(last["train_runtime"]) == final["train_runtime"]


def test_country_from_env_and_trackers_log_the_figures(monkeypatch, tmp_path, blobs):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.setenv("CODECARBON_COUNTRY_ISO_CODE", "FRA")
    x, y = blobs
    model = Model(mlp()).compile("adam", "cross_entropy")
    model.fit(x, y, epochs=1, batch_size=60, verbose=0, output_dir=str(tmp_path),
              report_to=["tensorboard", "codecarbon"])  # order of names does not matter: codecarbon runs first
    assert _read(tmp_path / "emissions.csv")[0]["country_iso_code"] == "FRA"
    acc = EventAccumulator(str(tmp_path / "runs"))
    acc.Reload()
    emissions = acc.Scalars("emissions")
    assert [e.step for e in emissions] == [model.state.global_step]
    assert emissions[0].value == pytest.approx(model.state.log_history[-1]["emissions"], rel=1e-6)


def test_callback_keeps_the_full_data(tmp_path, blobs):
    x, y = blobs
    cb = CodeCarbonCallback(country_iso_code="DEU", output_dir=tmp_path / "cc")
    Model(mlp()).compile("adam", "cross_entropy").fit(x, y, epochs=1, batch_size=60, verbose=0,
                                                       output_dir=str(tmp_path), callbacks=[cb])
    data = cb.final_emissions_data
    assert data is not None and data.country_iso_code == "DEU" and data.energy_consumed > 0
    assert (tmp_path / "cc" / "emissions.csv").is_file()
