"""A tracked run (TensorBoard, MLflow, CSV) that kills itself with SIGKILL at the end of step 7,
for tests/test_tracking_resume.py, which resumes it in its own process.

usage: tracked_kill.py OUTPUT_DIR MLFLOW_URI EXPERIMENT
"""

import os
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))  # the repository: `tests` imports

from tests.test_tracking_resume import Interrupt, _fit

if __name__ == "__main__":
    out, uri, experiment = sys.argv[1:4]
    _fit(pathlib.Path(out), uri, experiment, callbacks=[Interrupt("kill")])
    os._exit(3)  # not reached: the process is killed at step 7
