"""fitkit's benchmark harness (not part of the installed package).

    python -m benchmarks              # everything: peers table, scenarios, start-up, plot
    python -m benchmarks --quick      # a smoke run, well under a minute
    python -m benchmarks --help

Modules: `common` (workloads, interleaved timing, tables), `peers` (one adapter per
framework), `scenarios` (progress bar and validation, callbacks, DataLoader-bound),
`startup` (import time and time to the first optimizer step, in fresh processes),
`plot` (the figure), `run` (the command line). `overhead.py` and `resume_cost.py` are
stand-alone scripts. This file imports nothing heavy: start-up children import the package.
"""
