"""Out-of-memory errors, by accelerate's rule (`should_reduce_batch_size`): a `RuntimeError`
(`torch.OutOfMemoryError` is one) whose one argument says so, on CUDA, HIP, XPU, MPS, the CPU
allocator or HPU (and cuDNN's "not supported", which a smaller batch avoids too)::

    out_of_memory(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))  # True
"""

from __future__ import annotations

_PHRASES = (" out of memory.", "MPS backend out of memory", "cuDNN error: CUDNN_STATUS_NOT_SUPPORTED.",
            "DefaultCPUAllocator: can't allocate memory", "FATAL ERROR :: MODULE:PT_DEVMEM Allocation failed")


def out_of_memory(err: BaseException) -> bool:
    """Whether `err` is an out-of-memory error a smaller batch may avoid."""
    return (isinstance(err, RuntimeError) and len(err.args) == 1 and isinstance(err.args[0], str)
            and any(phrase in err.args[0] for phrase in _PHRASES))
