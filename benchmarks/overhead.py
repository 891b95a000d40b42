"""How much slower (or faster) is `Model.fit` than the PyTorch loop you would write by hand?

The harness's peers table restricted to four contenders on CPU: the two hand loops (raw and
slicing), fitkit and a raw Lightning Fabric loop, on the tiny and the compute-bound workloads,
interleaved in one process (see benchmarks/README.md for what is timed and how to read the table). The full
harness, with the other frameworks, the scenarios and start-up times, is `python -m benchmarks`.

    python benchmarks/overhead.py                     # both workloads, about a minute
    python benchmarks/overhead.py --quick             # smoke check, a few seconds
    python benchmarks/overhead.py --workload tiny --json results.json
    python benchmarks/overhead.py --no-trim           # glibc heap trimming off
    python benchmarks/overhead.py --clock cpu         # on a busy machine

Every option of `python -m benchmarks` applies (`--reps`, `--steps`, `--quiet`, ...).
"""

from __future__ import annotations

import os
import sys

if __package__ in (None, ""):  # run as a script: make the checkout's `benchmarks` package importable
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.run import main as run_main


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    return run_main(["--only", "peers", "--peers", "raw,fitkit,fabric", "--device", "cpu", *argv])


if __name__ == "__main__":
    sys.exit(main())
