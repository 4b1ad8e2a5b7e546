"""Output buffers: large ones are reused once PyTorch lets go of them, and fresh ones get huge pages."""

import pathlib

import pytest
import torch

from dcnb._src import memory

THP = pathlib.Path("/sys/kernel/mm/transparent_hugepage/enabled")
BIG = (8, 1 << 20)  # 32 MiB of float32


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


def test_a_released_buffer_is_reused_and_one_in_use_is_not():
    first = memory.empty(BIG, torch.float32)
    address = first.data_ptr()
    view = first[3]  # a view keeps the memory in use
    del first
    second = memory.empty(BIG, torch.float32)
    assert second.data_ptr() != address and second.data_ptr() % 64 == 0
    del view
    third = memory.empty(BIG, torch.float32)
    assert third.data_ptr() == address
    third.fill_(2.0)
    del third
    assert memory.empty(BIG, torch.float64).dtype == torch.float64  # another key, another buffer


def test_beyond_the_pool_tensors_are_fresh_and_small_ones_plain():
    held = [memory.empty(BIG, torch.float32) for _ in range(memory.limits()[1] + 2)]
    assert len({t.data_ptr() for t in held}) == len(held)
    assert memory.empty((3, 4), torch.float64).shape == (3, 4)
    assert torch.count_nonzero(memory.zeros(BIG, torch.float32)) == 0


@pytest.mark.skipif(not THP.is_file() or "[never]" in THP.read_text(), reason="the kernel offers no huge pages here")
def test_fresh_large_buffers_get_huge_pages():
    tensors = [memory.empty((16, 1 << 20), torch.float32) for _ in range(memory.limits()[1] + 1)]  # pooled and not
    for tensor in tensors:
        tensor.fill_(1.0)
        assert _huge_kib(tensor.data_ptr() + tensor.numel() * 2) >= 2048


def test_a_reused_buffer_comes_as_a_new_tensor():
    # handing out the same tensor again would carry its autograd history (and the graph it holds) to the next user
    first = memory.empty(BIG, torch.float32).requires_grad_()
    address = first.data_ptr()
    del first
    again = memory.empty(BIG, torch.float32)
    assert again.data_ptr() == address and not again.requires_grad
