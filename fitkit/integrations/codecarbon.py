"""`CodeCarbonCallback` (`report_to="codecarbon"`): the energy and CO2 emissions of training.

Needs `codecarbon` (`pip install "fitkit[codecarbon]"`), imported when training starts. Uses
`OfflineEmissionsTracker`, which needs no network: the carbon intensity comes from the
country given by `country_iso_code`, else `CODECARBON_COUNTRY_ISO_CODE`, else `"USA"`.
"""

from __future__ import annotations

import logging
import os
import warnings
from typing import TYPE_CHECKING, Any

from fitkit.common.urls import local_dir
from fitkit.events.handler import Order
from fitkit.integrations._common import TrackingCallback, require, trial_label

if TYPE_CHECKING:
    from codecarbon import OfflineEmissionsTracker
    from codecarbon.output import EmissionsData

DEFAULT_COUNTRY = "USA"
#: The figures added to the final record: name in the logs -> attribute of codecarbon's data.
FIGURES = {
    "emissions": "emissions",  # kg CO2-equivalent
    "emissions_rate": "emissions_rate",  # kg CO2-equivalent per second
    "energy_consumed": "energy_consumed",  # kWh (CPU + GPU + RAM)
}


class CodeCarbonCallback(TrackingCallback):
    """Measures the run from train begin to train end with codecarbon's
    `OfflineEmissionsTracker` on the world-zero process (so it covers that machine), writes
    codecarbon's `emissions.csv` to `output_dir` (default `args.output_dir`), and adds
    `emissions` (kg CO2eq), `emissions_rate` and `energy_consumed` (kWh) to the final record
    of `state.log_history` (a new record when the last one is not at the final step). It runs
    before the other trackers (order 55), which log these figures at train end too.

    `final_emissions_data` keeps codecarbon's full `EmissionsData` after training.

    Example::

        model.fit(x, y, report_to=["codecarbon", "mlflow"])
        model.state.log_history[-1]["emissions"]
    """

    order = Order.EMISSIONS  # before the other trackers' on_train_end, which pick up the figures

    def __init__(self, country_iso_code: str | None = None, output_dir: str | os.PathLike | None = None,
                 **tracker_kwargs: Any) -> None:
        super().__init__()
        require("codecarbon")
        self.country_iso_code = country_iso_code
        self.output_dir = None if output_dir is None else os.fspath(output_dir)
        self.tracker_kwargs = tracker_kwargs
        self.tracker: OfflineEmissionsTracker | None = None
        self.final_emissions_data: EmissionsData | None = None

    def setup(self, args, state, model) -> None:
        from codecarbon import OfflineEmissionsTracker

        output_dir = self.output_dir or local_dir(args.output_dir)
        os.makedirs(output_dir, exist_ok=True)  # codecarbon refuses a missing folder
        country = self.country_iso_code or os.environ.get("CODECARBON_COUNTRY_ISO_CODE") or DEFAULT_COUNTRY
        kwargs: dict[str, Any] = {
            "country_iso_code": country,
            "output_dir": output_dir,
            "project_name": trial_label(args, state) or "fitkit",
            "log_level": "error",
        }
        kwargs.update(self.tracker_kwargs)
        self.final_emissions_data = None
        level = kwargs["log_level"]
        logging.getLogger("codecarbon").setLevel(level.upper() if isinstance(level, str) else level)
        self.tracker = OfflineEmissionsTracker(**kwargs)
        self.tracker.start()

    def write(self, values: dict[str, Any], step: int, state) -> None:
        """Nothing to send per record: codecarbon measures the whole run."""

    def on_train_end(self, args, state, control, model=None, **kwargs):
        if not self._active:
            return
        self._active = False
        tracker, self.tracker = self.tracker, None
        if tracker is None:
            return
        tracker.stop()
        data = getattr(tracker, "final_emissions_data", None)
        if data is None:  # codecarbon logs its own errors and returns nothing
            warnings.warn("CodeCarbonCallback: codecarbon did not return emissions data", stacklevel=2)
            return
        self.final_emissions_data = data
        figures = {name: float(getattr(data, attr)) for name, attr in FIGURES.items()
                   if getattr(data, attr, None) is not None}
        last = state.log_history[-1] if state.log_history else None
        if last is not None and last.get("step") == state.global_step and "stopped" not in last:
            last.update(figures)
        else:
            state.log_history.append({**figures, "epoch": state.epoch, "step": state.global_step})
