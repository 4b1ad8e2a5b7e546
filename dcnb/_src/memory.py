"""Output buffers for the compiled code: reused once PyTorch lets go of them, else fresh with huge pages.

A large tensor comes straight from mmap, and the first write to each 4 KiB page faults and has the kernel clear
it: for a 50 MB output that is 12,000 faults, which cost more than the kernel that writes it (about 30 ms against
8 ms for the write itself on our 2-core machine). So, as PyTorch's CUDA caching allocator does for GPU memory:

- large buffers are pooled by shape and dtype, and handed out again once no tensor refers to them (their pages
  stay mapped: no fault, no clearing), as many of a shape as a call holds at once, up to a quarter of the
  machine's memory; they are mappings of their own, outside malloc's heap, which the rest of the process keeps
  to itself (native.cpp says what either cost);
- a fresh buffer is advised to use 2 MiB pages (madvise MADV_HUGEPAGE, as PyTorch's THP_MEM_ALLOC_ENABLE does)
  before its first write: 512x fewer faults.

The pool lives in the C++ extension (native.cpp), whose calls take their buffers from it without Python; without
the extension buffers are plain ``torch.empty``.
"""

from __future__ import annotations

import torch

from . import native


def empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized tensor: from the pool when large."""
    ext = native.extension()
    return torch.empty(shape, dtype=dtype) if ext is None else ext.empty(list(shape), dtype)


def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    ext = native.extension()
    return torch.zeros(shape, dtype=dtype) if ext is None else ext.zeros(list(shape), dtype)


def limits() -> tuple[int, int]:
    """(bytes from which tensors are pooled, bytes the pool keeps at most); (0, 0) without the extension."""
    ext = native.extension()
    return (0, 0) if ext is None else ext.pool_limits()


def pooled() -> list[tuple[int, bool]]:
    """(bytes, in use) of each pooled buffer."""
    ext = native.extension()
    return [] if ext is None else ext.pooled()


def configure(budget: int, huge_pages: bool = True) -> None:
    """Change the pool and empty it (for measurements and tests): it keeps at most ``budget`` bytes (0: pools
    nothing); ``huge_pages=False`` gives fresh buffers no advice."""
    ext = native.extension()
    if ext is not None:
        ext.configure_pool(budget, huge_pages)
