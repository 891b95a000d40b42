"""Saving and loading a `Model`: one weights-only file with the weights, the compile
configuration and the optimizer's state (with the last fit's scheduler state), so training
continued after `load` equals training continued in the original process.

    model.save("digits.pt")
    model = Model.load("digits.pt", make_net())    # a module of the same architecture
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

import torch

from fitkit.common.io import atomic_torch_save
from fitkit.common.urls import is_url, read_bytes
from fitkit.config.compile_config import CompileConfig
from fitkit.engine.checkpoint.model_file import write_model_file
from fitkit.facade.members import ModelMembers

if TYPE_CHECKING:  # pragma: no cover
    from fitkit.model import Model


class Saving(ModelMembers):
    """`save` and `load`, which `Model` inherits (they use only its public members)."""

    saved_scheduler_state: dict[str, Any] | None = None  # set by `load`: the last fit's scheduler state

    def save(self, path: str) -> None:
        """Save the weights, the compile configuration and the optimizer's state (and the last
        fit's scheduler state) to one weights-only file at `path`."""
        write_model_file(path, self.module, self.config, self.runtime.optimizer, self.runtime.scheduler)

    @classmethod
    def load(cls, path: str, module_or_model_init: torch.nn.Module | Callable[..., torch.nn.Module]) -> Model:
        """Load a model saved with `save` into `module_or_model_init`; compiled again when the
        configuration was made of names (callables must be passed to `compile` again), and its
        optimizer, built at the next fit, starts from the saved state. Each fit builds its
        learning-rate schedule afresh (as in the original process); the last fit's scheduler
        state is kept as `saved_scheduler_state`."""
        if not is_url(path) and not os.path.isfile(path):
            raise FileNotFoundError(f"no saved model at `path`={path!r}: pass the file written by Model.save")
        source = _source(path, "`path`")
        try:
            payload = torch.load(source, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 - any unpickling failure means "not safe / not ours"
            raise ValueError(f"{path!r} is not a fitkit model file that loads safely (weights only): {err}") from None
        if not isinstance(payload, dict) or payload.get("format") != "fitkit-model":
            raise ValueError(f"{path!r} is not a fitkit model file: expected one written by Model.save")
        model_cls = cast("type[Model]", cls)  # `Saving` is a mixin of `Model` only
        if isinstance(module_or_model_init, torch.nn.Module):
            model = model_cls(module_or_model_init)
        else:
            model = model_cls(model_init=module_or_model_init)
        model.module.load_state_dict(payload["state_dict"])
        config = CompileConfig.from_json(payload["config"]) if payload.get("config") else None
        if config is not None:
            model.compile(config.optimizer, config.loss, config.metrics, **config.options)
            # the optimizer is built at the first fit; it starts from the saved state then
            model.runtime.restore_optimizer_from(payload.get("optimizer"))
        model.saved_scheduler_state = payload.get("scheduler")
        return model

    def save_weights(self, filepath: str) -> None:
        """Save the module's weights (its `state_dict`, CPU copies) to one weights-only file,
        atomically (Keras' `save_weights`; the file is `torch.load`-able)."""
        atomic_torch_save({k: v.detach().cpu() for k, v in self.module.state_dict().items()}, filepath)

    def load_weights(self, filepath: str) -> None:
        """Load weights written by `save_weights`, `Model.save` or `ModelCheckpoint` into the
        module (weights-only loading: a file carrying code is refused)."""
        if not is_url(filepath) and not os.path.isfile(filepath):
            raise FileNotFoundError(f"no weights at `filepath`={filepath!r}: pass a file written by save_weights, "
                                    "Model.save or ModelCheckpoint")
        source = _source(filepath, "`filepath`")
        try:
            payload = torch.load(source, map_location="cpu", weights_only=True)
        except Exception as err:  # noqa: BLE001 - any unpickling failure means "not safe / not ours"
            raise ValueError(f"{filepath!r} is not a weights file that loads safely (weights only): {err}") from None
        if isinstance(payload, dict) and payload.get("format") == "fitkit-model":
            payload = payload["state_dict"]
        if not isinstance(payload, dict) or not all(isinstance(v, torch.Tensor) for v in payload.values()):
            raise ValueError(f"{filepath!r} holds no state dict: pass a file written by save_weights or Model.save")
        self.module.load_state_dict(payload)


def _source(path: str, argument: str) -> Any:
    """What `torch.load` reads: the local path, or the object at a URL read into memory."""
    if not is_url(path):
        return path
    import io

    return io.BytesIO(read_bytes(path, argument))
