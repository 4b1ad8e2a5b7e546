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


@pytest.fixture
def budget():
    """Set the pool's budget for one test, emptying the pool; the default again afterwards."""
    default = memory.limits()[1]
    yield lambda nbytes: memory.configure(nbytes)
    memory.configure(default)


def test_a_call_holding_many_buffers_of_a_shape_gets_them_all_again(budget):
    # a 12-layer encoder's backward returns 12 weight gradients of each shape: each must come back, not four
    budget(1 << 30)
    held = [memory.empty(BIG, torch.float32) for _ in range(12)]
    addresses = {t.data_ptr() for t in held}
    del held
    again = [memory.empty(BIG, torch.float32) for _ in range(12)]
    assert {t.data_ptr() for t in again} == addresses
    assert memory.pooled() == [(32 << 20, True)] * 12  # kept, not fresh mappings at the same addresses


def test_past_its_budget_the_pool_lets_idle_buffers_go_and_beyond_that_tensors_are_fresh(budget):
    budget(3 * (32 << 20))
    held = [memory.empty(BIG, torch.float32) for _ in range(5)]
    assert len({t.data_ptr() for t in held}) == 5
    assert sum(n for n, _ in memory.pooled()) == 3 * (32 << 20)
    del held
    other = memory.empty((4, 1 << 21), torch.float64)  # 64 MiB of another shape: idle buffers make room
    assert sum(n for n, in_use in memory.pooled() if in_use) == 64 << 20
    assert sum(n for n, _ in memory.pooled()) <= 3 * (32 << 20)
    assert memory.empty((3, 4), torch.float64).shape == (3, 4)
    assert torch.count_nonzero(memory.zeros(BIG, torch.float32)) == 0
    del other
    budget(0)
    assert memory.empty(BIG, torch.float32).shape == BIG and not memory.pooled()


def test_pooled_buffers_are_outside_mallocs_heap():
    # held there, they would split the heap the rest of the process allocates from (memory.py). Once a block as
    # large has been freed, malloc serves 8 MiB from its heap
    torch.empty(16 << 20, dtype=torch.uint8).fill_(0)
    tensor = memory.empty((2, 1 << 20), torch.float32)
    for line in pathlib.Path("/proc/self/maps").read_text().splitlines():
        start, end = (int(v, 16) for v in line.split()[0].split("-"))
        if start <= tensor.data_ptr() < end:
            assert not line.endswith("[heap]")
            break
    else:
        raise AssertionError("no mapping holds the buffer")
    tensor.resize_(16, 1 << 20)  # resizable as PyTorch's own tensors are
    tensor.fill_(1.0)


@pytest.mark.skipif(not THP.is_file() or "[never]" in THP.read_text(), reason="the kernel offers no huge pages here")
def test_fresh_large_buffers_get_huge_pages(budget):
    budget(64 << 20)
    tensors = [memory.empty((16, 1 << 20), torch.float32), memory.empty((16, 1 << 21), torch.float32)]  # pooled, not
    assert len(memory.pooled()) == 1
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
