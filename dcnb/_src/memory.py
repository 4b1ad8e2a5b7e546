"""Output buffers for the compiled code: reused once PyTorch lets go of them, else fresh with huge pages.

A large tensor comes straight from mmap, and the first write to each 4 KiB page faults and has the kernel clear
it: for a 50 MB output that is 12,000 faults, which cost more than the kernel that writes it (about 30 ms against
8 ms for the write itself on our 2-core machine). So, as PyTorch's CUDA caching allocator does for GPU memory:

- large buffers are pooled by shape and dtype, and handed out again once no tensor refers to them (their pages
  stay mapped: no fault, no clearing);
- a fresh buffer is advised to use 2 MiB pages (madvise MADV_HUGEPAGE, as PyTorch's THP_MEM_ALLOC_ENABLE does)
  before its first write: 512x fewer faults.
"""

from __future__ import annotations

import ctypes
import functools
import math
import pathlib
import sys
import threading

import numpy as np
import torch

_HUGE = 2 << 20
#: tensors smaller than this are neither pooled nor advised (they often come from the heap, already mapped)
THRESHOLD = 4 << 20
#: buffers kept per (shape, dtype); beyond, tensors are fresh and not pooled
PER_SHAPE = 4
_MADV_HUGEPAGE = 14
_ALIGN = 64


@functools.cache
def _madvise():
    mode = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not mode.is_file() or "[never]" in mode.read_text():
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def _advise(address: int, nbytes: int) -> None:
    madvise = _madvise()
    if madvise is not None:
        start = -(-address // _HUGE) * _HUGE
        end = (address + nbytes) // _HUGE * _HUGE
        if end > start:
            madvise(start, end - start, _MADV_HUGEPAGE)  # advice only: failure leaves ordinary pages


class _Pool:
    """Arrays handed to PyTorch through torch.from_numpy, which holds a reference to the array for as long as any
    tensor or view uses its memory: an array only the pool refers to is free again."""

    def __init__(self) -> None:
        self._arrays: dict[tuple, list[np.ndarray]] = {}
        self._lock = threading.Lock()

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        try:
            np_dtype = torch.empty(0, dtype=dtype).numpy().dtype
        except TypeError:  # bfloat16 and others numpy lacks
            return None
        key = (tuple(shape), np_dtype)
        with self._lock:
            arrays = self._arrays.setdefault(key, [])
            for array in arrays:
                # references: the list, this loop's variable, getrefcount's argument; a tensor adds one
                if sys.getrefcount(array) <= 3:
                    return torch.from_numpy(array)
            if len(arrays) >= PER_SHAPE:
                return None
            array = _aligned_array(shape, np_dtype)
            arrays.append(array)
            return torch.from_numpy(array)


def _aligned_array(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    count = int(np.prod(shape, dtype=np.int64))
    raw = np.empty(count * dtype.itemsize + _ALIGN, dtype=np.uint8)
    offset = -raw.ctypes.data % _ALIGN
    _advise(raw.ctypes.data + offset, count * dtype.itemsize)
    return raw[offset : offset + count * dtype.itemsize].view(dtype).reshape(shape)


_POOL = _Pool()


def empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """An uninitialized tensor: from the pool when large, else torch.empty."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes >= THRESHOLD:
        pooled = _POOL.take(shape, dtype)
        if pooled is not None:
            return pooled
        tensor = torch.empty(shape, dtype=dtype)
        _advise(tensor.data_ptr(), nbytes)
        return tensor
    return torch.empty(shape, dtype=dtype)


def zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    return empty(shape, dtype).zero_()
