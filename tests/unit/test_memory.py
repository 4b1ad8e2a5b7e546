"""Fresh output tensors: large ones are backed by transparent huge pages where the kernel offers them."""

import pathlib

import pytest
import torch

from dcnb._src import memory

THP = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _huge_kib(address: int) -> int:
    """AnonHugePages of the mapping holding ``address`` in this process."""
    current, huge = None, 0
    for line in pathlib.Path("/proc/self/smaps").read_text().splitlines():
        head = line.split()[0]
        if "-" in head and ":" not in head:
            start, end = (int(v, 16) for v in head.split("-"))
            current = start <= address < end
        elif current and head == "AnonHugePages:":
            huge = int(line.split()[1])
    return huge


@pytest.mark.skipif(not THP.is_file() or "[never]" in THP.read_text(), reason="the kernel offers no huge pages here")
def test_large_outputs_get_huge_pages():
    tensor = memory.empty((16, 1 << 20), torch.float32)  # 64 MiB
    tensor.fill_(1.0)
    assert _huge_kib(tensor.data_ptr() + tensor.numel() * 2) >= 2048


def test_small_outputs_and_zeros_are_plain_tensors():
    small = memory.empty((3, 4), torch.float64)
    assert small.shape == (3, 4) and small.dtype == torch.float64
    assert torch.count_nonzero(memory.zeros((1 << 21,), torch.float32)) == 0
