"""`ModelMembers`: what `Model`'s mixins (steps, evaluation, Keras' and HF's methods, saving) use of
the model, declared once for type checkers; `fitkit.model.Model` or one of its mixins defines each."""

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
                      keep: bool = False, announce: bool = True) -> tuple[dict[str, float], tuple[Any, Any] | None]: ...

        def _spawned(self, method: str, args: Any, call: dict[str, Any]) -> Any: ...

        def _evaluation_trainer(self, args: Any, callbacks: Any, verbose: int | str) -> Any: ...

        def _module_for(self, args: Any) -> torch.nn.Module: ...

        @property
        def metrics_names(self) -> list[str]: ...

        def _evaluation_arguments(self, what: str | None, data_options: dict[str, Any]) -> Any: ...

        def fit_evaluation_data(self, what: str = "evaluate") -> Any: ...

        def hf_named(self, metrics: dict[str, Any], prefix: str, speed: tuple[float, Any, int] | None = None,
                     epoch: bool = True) -> dict[str, Any]: ...

        def hf_logged(self, args: Any, metrics: dict[str, Any], prefix: str | None, speed: tuple[float, Any, int],
                      callbacks: Any) -> dict[str, Any] | None: ...

        def _handler(self, extra: Any, *more: Any) -> Any: ...
