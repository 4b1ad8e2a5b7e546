"""The CUDA path on a machine without a GPU: DaCe's CUDA code generation and nvcc build dcnb's SDFGs.

Running them needs a GPU (checked where one is lent: benchmarks/NOTES.md); what can break without one is caught
here, from the generated code.
"""

import math
import os
import pathlib
import re
import time

import pytest
import torch
from torch import nn

import dcnb
from dcnb._src import cuda_check, native, timing
from dcnb._src.views import render
from dcnb._src.views.widget import SessionWidget
from tests.cuda_sources import built_sources, cuda_sources, for_cuda
from tests.hf_models import MODELS
from tests.models import Mish
from tests.zoo import CASES, ZOO

pytestmark = pytest.mark.compile


def _program_body(host: str) -> str:
    """The code that runs on every call (not the binary's one-time initialization)."""
    return re.search(r"void __program_\w+_internal\(.*?\n}\n", host, re.S).group(0)


@pytest.mark.cuda
def test_library_nodes_become_kernels():
    # Softmax's forward is one ONNX node and no map: it ran as host loops over device pointers (a segfault)
    session = dcnb.optimize(nn.Softmax(dim=-1), torch.randn(4, 8, 64), baselines=(), time_budget=0.0)
    for host, cuda in cuda_sources(session):
        assert "__global__" in cuda and "for (" not in host
        # temporaries allocated once per loaded binary, not on every call
        assert "cudaMalloc" in host and "cudaMalloc" not in _program_body(host)
        # and no host wait in a call, the functions of the Reduce nodes' expansions included (each ended with one)
        assert "Synchronize(" not in native._without_functions(host, ("__dace_init", "__dace_exit"))


@pytest.mark.cuda
def test_every_kernel_launches_on_the_one_stream_of_its_binary():
    # DaCe numbered the streams after a nested SDFG from the count the nested one needs: kernels after a
    # transpose's expansion launched on streams[1] of a context of one stream, a read past the end of its array
    torch.manual_seed(0)
    session = dcnb.optimize(PreNormBlock(), torch.randn(2, 16, 32), baselines=(), time_budget=0.0)
    for host, cuda in cuda_sources(session):
        assert re.search(r"new dace::cuda::Context\(1, \d+\)", cuda)
        # i, streamid: the loop and the argument of DaCe's functions that set them
        assert set(re.findall(r"streams\[(\w+)\]", host + cuda)) <= {"0", "i", "streamid"}


@pytest.mark.cuda
def test_auto_optimize_for_a_gpu_copies_no_argument_in_a_call():
    # DaCe's GPU transformation gave each argument a copy of its own in GPU memory, copied in and out on every call,
    # where dcnb passes the arguments in GPU memory already: 84 copies per call of a BERT-base layer on an H200
    torch.manual_seed(0)
    session = dcnb.optimize(PreNormBlock(), torch.randn(2, 16, 32), baselines=(), time_budget=0.0)
    assert session.apply("auto_optimize").ok
    sdfgs = for_cuda(session)
    arguments = {name for sdfg in sdfgs for name, desc in sdfg.arrays.items() if not desc.transient}
    assert {"fc1DOTweight", "x"} <= arguments
    for host, _ in cuda_sources(session, sdfgs=sdfgs):
        assert not [name for name in arguments if re.search(rf"gpu_{re.escape(name)}\b", host)]

@pytest.mark.cuda
def test_a_maximum_over_many_rows_loops_per_row_on_a_gpu():
    # a float has no atomic maximum on a GPU: DaCe's "pure" Reduce retried a compare-and-swap per element, each row's
    # threads against each other (a BERT-base layer's softmax: 362 us of its 2.3 ms of kernels on an H200)
    session = dcnb.optimize(nn.Softmax(dim=-1), torch.randn(64, 16, 32), baselines=(), time_budget=0.0)
    (_, forward), _ = cuda_sources(session)
    assert "ReductionType::Max, float>::reduce(acc" in forward
    assert not re.search(r"ReductionType::Max[^;]*reduce_atomic", forward)


@pytest.mark.cuda
@pytest.mark.parametrize("op,layer", [("Dropout", nn.Dropout(0.0)), ("Clip", nn.ReLU6())], ids=["dropout", "clip"])
def test_elementwise_gradients_spread_over_the_gpu_s_threads(op, layer):
    # the backward rules of a Dropout of nothing in training mode (transformers' configs) and of Clip (ReLU6) were
    # C++ loops, one thread on a GPU: three such Dropouts took 30 of a BERT-base layer's 32 ms of kernels on an H200
    module = nn.Sequential(nn.Linear(16, 64), layer)
    session = dcnb.optimize(module, torch.randn(4, 16), baselines=(), time_budget=0.0, training=True)
    _, (_, backward) = cuda_sources(session)
    launch = rf"cudaLaunchKernel\(\(void\*\)(\w*{op}_backward\w*), dim3\((.*?)\), dim3\((.*?)\)"
    launches = re.findall(launch, backward)
    assert len(launches) == 1, launches
    _, blocks, threads = launches[0]
    assert math.prod(map(int, blocks.split(","))) * math.prod(map(int, threads.split(","))) >= 4 * 64, launches


@pytest.mark.cuda
def test_layer_norm_and_accumulated_gradients_build_for_cuda():
    # DaCe's CUDA code generation had no copy that adds into GPU memory (autodiff sums the MLP's gradients so),
    # and passed LayerNorm's scalar epsilon to a kernel by value where a pointer was needed
    module, inputs = CASES["mlp"].build()
    session = dcnb.optimize(module, *inputs, baselines=(), time_budget=0.0)
    assert all("__global__" in cuda for _, cuda in cuda_sources(session))


@pytest.mark.cuda
@pytest.mark.parametrize(
    "name,training",
    [pytest.param(c.name, c.modes[-1], id=f"{c.name}-{'train' if c.modes[-1] else 'eval'}") for c in ZOO],
)
def test_the_zoo_builds_for_cuda(name, training):
    # each entry's naive step in its last mode (training where it has one: batch statistics, the loss's gradient)
    module, inputs = CASES[name].build()
    session = dcnb.optimize(module, *inputs, training=training, baselines=(), time_budget=0.0)
    assert all("__global__" in cuda for _, cuda in cuda_sources(session))


@pytest.mark.cuda
@pytest.mark.parametrize("model", MODELS, ids=[m.name for m in MODELS])
def test_the_hugging_face_models_build_for_cuda(model):
    module, inputs, kwargs = model.build()
    session = dcnb.optimize(module, *inputs, kwargs=kwargs, training=model.modes[-1], baselines=(), time_budget=0.0)
    assert all("__global__" in cuda for _, cuda in cuda_sources(session))


class PreNormBlock(nn.Module):
    """A pre-norm transformer block written by hand: LayerNorm, 4-head attention, LayerNorm, a GELU MLP."""

    def __init__(self, dim: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc1, self.fc2 = nn.Linear(dim, 2 * dim), nn.Linear(2 * dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=2)
        q, k, v = (z.reshape(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        attention = torch.softmax(q @ k.transpose(-2, -1) / (c // self.heads) ** 0.5, dim=-1) @ v
        x = x + self.out(attention.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(nn.functional.gelu(self.fc1(self.norm2(x))))


@pytest.mark.cuda
def test_every_step_of_a_transformer_block_builds_for_cuda():
    """The steps a user takes in the widget, one after the other, each built for CUDA in the background (after
    auto_optimize the CPU's BLAS calls reached the CUDA build: "identifier CblasColMajor is undefined")."""
    torch.manual_seed(0)
    session = dcnb.optimize(PreNormBlock(), torch.randn(2, 16, 32), baselines=(), time_budget=0.0, cuda_build=True)
    for name in ("auto_optimize", "vectorization", "tasklet_fusion", "fuse_rows", "map_fusion"):
        session.apply(name)
    good = [step for step in session.history if step.ok]
    assert [s.name for s in good][:3] == ["naive", "auto_optimize", "vectorization"], session.as_text()
    for step in good:
        cuda = _ended(step)
        assert cuda.state == "ok", (step.name, cuda.text, cuda.log and cuda.log[-3000:])


#: the steps of the transformer block above, each applied to a zoo entry's naive step: vectorization and fuse_rows
#: are for the CPU only, so theirs builds what the naive step's does (cached); the others each build anew
ZOO_STEPS = ("auto_optimize", "vectorization", "tasklet_fusion", "fuse_rows", "map_fusion")


@pytest.mark.cuda
@pytest.mark.parametrize(
    "name,training",
    [pytest.param(c.name, c.modes[-1], id=f"{c.name}-{'train' if c.modes[-1] else 'eval'}") for c in ZOO],
)
def test_every_step_of_the_zoo_builds_for_cuda(name, training):
    """Each of the steps that applies to a zoo entry, taken from its naive step, builds for CUDA in the background
    (after auto_optimize, BatchNorm's gradient summed over a 1x1 broadcast crashed DaCe's GPU reduction planner, and
    the MLP's loss gradient reached its kernel as a reference where a pointer was needed)."""
    module, inputs = CASES[name].build()
    session = dcnb.optimize(module, *inputs, training=training, baselines=(), time_budget=0.0, cuda_build=True)
    steps = [session.current]
    for action in ZOO_STEPS:
        step = session.apply(action)
        if step.ok:  # (a step the CPU refuses, or that matches nothing, is tests/compile/test_zoo.py's to judge)
            steps.append(step)
            session.undo()
    assert [s.name for s in steps][:2] == ["naive", "auto_optimize"], session.as_text()
    for step in steps:
        cuda = _ended(step)
        assert cuda.state == "ok", (step.name, cuda.text, cuda.log and cuda.log[-3000:])


# --- the CUDA build every CPU step also makes in the background ---------------------------------------------------

#: seconds a test waits for the background builds queued before it ends (each takes about a minute here)
WAIT = 900


def _ended(step: dcnb.Step) -> cuda_check.CudaBuild:
    assert step.cuda is not None
    assert step.cuda.wait(WAIT), step.cuda.text
    return step.cuda


def test_every_cpu_step_builds_for_cuda_in_the_background(fresh_cache):
    session = dcnb.optimize(Mish(), torch.rand(2, 3, 8, 8), baselines=(), time_budget=0.0, cuda_build=True)
    naive = session.current
    # the CPU result came back while the CUDA build goes on (a minute here, from an empty cache)
    assert naive.ok and naive.cuda.state == "pending" and "CUDA build: pending (sm_90" in naive.as_text()
    widget = SessionWidget(session)
    request = {"method": "custom", "content": {"event": "apply", "name": "tasklet_fusion"}}
    widget._handle_msg({"content": {"data": request}, "buffers": []})  # as the view asks, through the comm
    fused = session.current
    assert fused.name == "tasklet_fusion" and fused.ok
    for step in (naive, fused):
        cuda = _ended(step)
        assert cuda.state == "ok", (cuda.text, cuda.log)
        # (cached where this process built the same binary before)
        assert re.fullmatch(r"CUDA build: ok \(sm_90, (\d+\.\d s|cached)\)", cuda.text)
        assert cuda.text in step.as_text()
    assert fused.cuda.text in render.to_html(session)
    # the view shows the outcome without a request (its thread sets the trait once the build ended)
    deadline = time.monotonic() + 10
    while widget.steps[-1]["cuda"]["state"] != "ok" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert widget.steps[-1]["cuda"]["text"] == fused.cuda.text
    # cached by content: the same step built again takes nothing
    again = dcnb.optimize(Mish(), torch.rand(2, 3, 8, 8), baselines=(), time_budget=0.0, cuda_build=True)
    assert _ended(again.current).text == "CUDA build: ok (sm_90, cached)"
    # the code built: kernels launched on the binary's one stream, which each call sets to PyTorch's current one,
    # with no host wait in a call, in blocks of 256 threads (8 rows of 32), not DaCe's one warp
    built = sorted(found.parents[1] for found in fresh_cache.glob("builds/*/src/cuda"))
    assert len(built) == 4  # the naive and the fused step's forward and backward
    for folder in built:
        host, cuda = built_sources(folder)
        assert "__global__" in cuda and "__launch_bounds__(256)" in cuda
        launches = re.findall(r"cudaLaunchKernel\(.*\);", cuda)
        on_its_stream = ", 0, __state->gpu_context->streams[0]);"
        assert launches and all(launch.endswith(on_its_stream) for launch in launches), launches
        assert "Synchronize(" not in _program_body(host)


def _states(pid: int) -> set[str]:
    """The run states (/proc's: R, S, T for stopped, ...) of a process group's processes: a build and its compilers."""
    found = set()
    for stat in pathlib.Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # a process that ended meanwhile
            continue
        if int(fields[2]) == pid:  # its process group
            found.add(fields[0])
    return found


def test_a_background_build_is_stopped_while_a_step_is_timed(fresh_cache, monkeypatch):
    """A step's timing has the cores to itself: the CUDA build of an earlier step (a minute of nvcc here) is stopped
    with its compilers while it is timed, and goes on afterwards."""
    session = dcnb.optimize(Mish(), torch.rand(2, 3, 8, 8), baselines=(), time_budget=0.0, cuda_build=True)
    builds = session._cuda_builds
    deadline = time.monotonic() + 30
    while builds._running is None and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = builds._running.child.pid
    seen = []
    time_step = timing.Baselines.time

    def stopped() -> set[str]:
        # a signal is delivered when the process next enters the kernel: within a scheduler tick
        deadline = time.monotonic() + 2
        while (states := _states(pid)) != {"T"} and time.monotonic() < deadline:
            time.sleep(0.01)
        return states

    monkeypatch.setattr(timing.Baselines, "time", lambda self, c: seen.append(stopped()) or time_step(self, c))
    try:
        assert session.apply("tasklet_fusion").ok
        assert seen and seen[0] == {"T"}, seen  # every process of the build stopped
        deadline = time.monotonic() + 2
        while "T" in _states(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "T" not in _states(pid) and session.history[0].cuda.state == "pending"
    finally:
        builds.close()


def test_the_view_cancels_a_running_and_a_queued_cuda_build_with_their_compilers(fresh_cache):
    session = dcnb.optimize(Mish(), torch.rand(2, 3, 8, 8), baselines=(), time_budget=0.0, cuda_build=True)
    builds = session._cuda_builds
    widget = SessionWidget(session)
    try:
        assert session.apply("tasklet_fusion").ok  # its build queued behind the naive step's
        deadline = time.monotonic() + 30
        while builds._running is None and time.monotonic() < deadline:
            time.sleep(0.05)
        running, queued = session.history[0].cuda, session.history[1].cuda
        pid = builds._running.child.pid
        assert builds._running.status is running and queued.state == "pending"
        for index, build in ((1, queued), (0, running)):
            start = time.monotonic()
            request = {"method": "custom", "content": {"event": "cancel_cuda", "index": index}}
            widget._handle_msg({"content": {"data": request}, "buffers": []})
            assert build.wait(2) and time.monotonic() - start < 2
            assert build.state == "cancelled" and build.text == "CUDA build: cancelled (sm_90)", build.text
            assert widget.message == f"step {index}: CUDA build: cancelled (sm_90)"
        # the build's process and its compilers are gone, and the view shows it without a request
        deadline = time.monotonic() + 2
        while _states(pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not _states(pid)
        assert [s["cuda"]["state"] for s in widget._steps()] == ["cancelled", "cancelled"]
        widget._handle_msg({"content": {"data": request}, "buffers": []})
        assert widget.message == "step 0 has no CUDA build under way to cancel"
    finally:
        builds.close()


def test_a_step_that_does_not_build_for_cuda_says_why_and_stays_good(monkeypatch):
    # an architecture nvcc does not know, past the option's check: nvcc refuses it as it refuses code it cannot build
    monkeypatch.setattr(cuda_check, "ARCHES", (*cuda_check.ARCHES, "12"))
    session = dcnb.optimize(Mish(), torch.rand(2, 3, 8, 8), baselines=(), time_budget=0.0, cuda_arch="sm_12",
                            cuda_build=True)
    step = session.current
    cuda = _ended(step)
    assert step.ok and session.module(torch.rand(2, 3, 8, 8)).shape == (2, 3, 8, 8)
    assert cuda.state == "failed" and "Unsupported gpu architecture 'compute_12'" in cuda.reason, cuda.text
    assert "nvcc fatal" in cuda.log
    assert f"CUDA build: failed (sm_12): {cuda.reason}" in step.as_text()
    html = render.step_html(step)
    assert "CUDA build: failed" in html and "CUDA build log" in html


def test_no_cuda_build_when_turned_off_or_without_nvcc(monkeypatch):
    module, x = Mish(), torch.rand(2, 3, 8, 8)
    assert dcnb.optimize(module, x, baselines=(), time_budget=0.0, cuda_build=False).current.cuda is None
    assert os.environ["DCNB_CUDA_BUILD"] == "0"  # (tests/conftest.py)
    assert dcnb.optimize(module, x, baselines=(), time_budget=0.0).current.cuda is None
    monkeypatch.setattr(cuda_check, "nvcc_present", lambda: False)
    step = dcnb.optimize(module, x, baselines=(), time_budget=0.0, cuda_build=True).current
    assert step.cuda.text == "CUDA build: skipped (no nvcc)" and step.cuda.text in step.as_text()
    with pytest.raises(dcnb.InputError, match="cuda_arch 'sm_75' is not a CUDA architecture dcnb builds for"):
        dcnb.optimize(module, x, cuda_arch="sm_75")


@pytest.mark.cuda
def test_a_max_over_rows_builds_for_cuda_after_auto_optimize():
    # DaCe's GPUAuto reduction loads float4 vectors and reduced them with max, which CUDA's float4 lacks: "no operator
    # ">" matches these operands" (a BERT-mini layer's softmax)
    session = dcnb.optimize(nn.Softmax(dim=-1), torch.randn(4, 8, 64), baselines=(), time_budget=0.0, cuda_build=True)
    step = session.apply("auto_optimize")
    assert step.ok, step.error
    assert _ended(step).state == "ok", (step.cuda.text, step.cuda.log and step.cuda.log[-2000:])
