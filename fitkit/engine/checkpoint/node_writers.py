"""Which processes write a checkpoint's files (HF's `save_on_each_node`).

The global-zero process, or with `save_on_each_node` the local-zero process of every node (the
Trainer's `args.should_save`), for nodes that do not share the `output_dir`'s disk::

    if writes_checkpoints(fabric, args):
        ...                                    # prepare, commit, rotate
    save_payload(fabric, path, payload, args)  # every process calls it (Fabric's save ends with a barrier)
"""

from __future__ import annotations

from typing import Any


def writes_checkpoints(fabric: Any, args: Any) -> bool:
    """Whether this process writes checkpoint files: the local rank 0 of each node under
    `save_on_each_node`, else the global rank 0 alone."""
    if getattr(args, "save_on_each_node", False):
        return fabric.local_rank == 0
    return fabric.is_global_zero


def save_payload(fabric: Any, path: str, payload: dict[str, Any], args: Any) -> None:
    """`fabric.save(path, payload)`, and under `save_on_each_node` the same file written by the
    local-zero process of every other node too (Fabric writes a whole checkpoint on global rank 0
    only). A sharded strategy, whose processes each write their own part, is refused on every
    process before anything is written."""
    extra = writes_checkpoints(fabric, args) and not fabric.is_global_zero
    if getattr(args, "save_on_each_node", False) and fabric.world_size > 1:
        from lightning_fabric.strategies.strategy import Strategy

        strategy = fabric.strategy
        if type(strategy).save_checkpoint is not Strategy.save_checkpoint:
            raise ValueError(f"`save_on_each_node`=True needs a strategy whose checkpoint one process writes whole "
                             f"(ddp), not {type(strategy).__name__}, whose processes each write their part: set "
                             "`save_on_each_node`=False and give every node an `output_dir` on a shared disk")
    fabric.save(path, payload)
    if extra:
        from lightning_fabric.fabric import _unwrap_objects

        strategy = fabric.strategy
        state = strategy._convert_stateful_objects_in_state(_unwrap_objects(payload), filter={})
        strategy.checkpoint_io.save_checkpoint(checkpoint=state, path=path)
