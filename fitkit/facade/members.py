"""`ModelMembers`: what `Model`'s mixins (steps, Keras' and HF's methods, saving) use of the model,
declared once for type checkers; `fitkit.model.Model` defines each of them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from fitkit.config.compile_config import CompileConfig
    from fitkit.engine.runtime import Runtime
    from fitkit.events.state import TrainerState


class ModelMembers:
    """The base of `Model`'s mixins: no behaviour, only the members they read, for type checkers."""

    if TYPE_CHECKING:  # pragma: no cover
        config: CompileConfig | None
        state: TrainerState
        control: Any
        _last_output_dir: str | None
        _in_force: dict[str, Any] | None

        @property
        def module(self) -> torch.nn.Module: ...

        @property
        def optimizer(self) -> Any: ...

        @property
        def runtime(self) -> Runtime: ...

        @property
        def fabric(self) -> Any: ...

        def _compiled(self, what: str) -> CompileConfig: ...

        def _evaluate(self, args: Any, x: Any, y: Any, batch_size: int | None, verbose: int | str,
                      sample_weight: Any, steps: int | None, callbacks: Any,
                      keep: bool = False) -> tuple[dict[str, float], tuple[Any, Any] | None]: ...

        def _spawned(self, method: str, args: Any, call: dict[str, Any]) -> Any: ...

        def _handler(self, extra: Any, *more: Any) -> Any: ...
