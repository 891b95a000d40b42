"""`ModelMembers`: what `Model`'s mixins (steps, Keras' and HF's methods, saving) use of the model,
declared once for type checkers; `fitkit.model.Model` defines each of them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover
    import torch

    from fitkit.config.compile_config import CompileConfig
    from fitkit.engine.runtime import Runtime


class ModelMembers:
    """The base of `Model`'s mixins: no behaviour, only the members they read, for type checkers."""

    if TYPE_CHECKING:  # pragma: no cover
        config: CompileConfig | None

        @property
        def module(self) -> torch.nn.Module: ...

        @property
        def optimizer(self) -> Any: ...

        @property
        def runtime(self) -> Runtime: ...

        def _compiled(self, what: str) -> CompileConfig: ...
