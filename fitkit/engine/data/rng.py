"""Random number generators: seeding a run, and their states for checkpoints.

    seed_everything(42)          # Python, NumPy, torch (and CUDA)
    saved = rng_state()          # weights-only-loadable
    set_rng_state(saved)
"""

from __future__ import annotations

from typing import Any, cast


def seed_everything(seed: int | None) -> None:
    """Seed Python, NumPy and torch (all devices) when `seed` is not None."""
    if seed is None:
        return
    import random

    import torch

    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed % 2**32)
    except ImportError:  # pragma: no cover
        pass
    # torch.manual_seed would also queue seeds for every device type (~0.1 ms a call on CPU)
    torch.default_generator.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def rng_state() -> dict[str, Any]:
    """Python, NumPy, torch (and CUDA) generator states in weights-only-loadable form."""
    import random

    import torch

    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {"python": [version, list(internal), gauss], "torch": torch.get_rng_state()}
    try:
        import numpy as np

        # the legacy tuple, the default (NumPy's stubs give the call with no argument the dict form)
        kind, keys, pos, has_gauss, cached = cast("tuple[str, np.ndarray, int, int, float]", np.random.get_state())
        state["numpy"] = [kind, torch.from_numpy(keys.astype("int64")), pos, has_gauss, cached]
    except ImportError:  # pragma: no cover
        pass
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    import random

    import torch

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def same_rng_state(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two `rng_state()` results are the same (nothing drew a number in between)."""
    import torch

    def same(x: Any, y: Any) -> bool:
        if isinstance(x, torch.Tensor):
            return isinstance(y, torch.Tensor) and torch.equal(x, y)
        if isinstance(x, (list, tuple)) and any(isinstance(v, (torch.Tensor, list, tuple)) for v in x):
            return isinstance(y, (list, tuple)) and len(x) == len(y) and all(map(same, x, y))
        return bool(x == y)

    return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
