"""The generated source of a compiled step and the lines of it each node's code is (the widget's code view), on
real builds: Mish, the zoo's MLP and transformer layer on the CPU, the fused Mish built for CUDA with nvcc."""

import json
import pathlib
import re
import shutil

import dace
import pytest
import torch
from dace.codegen import codegen
from dace.config import Config, temporary_config
from dace.sdfg import nodes
from tests.models import Mish
from tests.zoo import CASES

import dcnb
from dcnb._src import build
from dcnb._src.views import overlays, sources

pytestmark = pytest.mark.compile

#: the nodes whose code the view shows
CODE = (nodes.Tasklet, nodes.MapEntry, nodes.MapExit, nodes.LibraryNode, nodes.NestedSDFG)


@pytest.fixture(scope="module")
def fused_mish():
    session = dcnb.optimize(Mish(), torch.rand(2, 3, 8, 8), baselines=(), time_budget=0.0)
    assert session.apply("tasklet_fusion").ok
    return session


def _code(source: dict, node: nodes.Node) -> str:
    first, last = source["nodes"][node.guid]
    return "\n".join(source["text"].split("\n")[first - 1 : last])


def _only(sdfg: dace.SDFG, kind: type) -> nodes.Node:
    (found,) = [n for n, _ in sdfg.all_nodes_recursive() if isinstance(n, kind)]
    return found


def test_the_fused_mish_tasklet_and_its_map_point_at_their_code(fused_mish):
    found = sources.of(fused_mish)
    json.dumps(found)  # plain data, as the widget sends it
    forward, backward = fused_mish.compiled_sdfgs()
    for sdfg, source in ((forward, found["forward"]), (backward, found["backward"])):
        assert source["language"] == "cpp"
        # the whole source, each file after a header line, as the build compiled it
        (path,) = re.findall(r"^// ---- (src/cpu/\w+\.cpp) ----$", source["text"], re.MULTILINE)
        assert source["text"].endswith((pathlib.Path(sdfg.build_folder) / path).read_text())
        tasklet, entry = _only(sdfg, nodes.Tasklet), _only(sdfg, nodes.MapEntry)
        code = _code(source, tasklet)
        assert f"// Tasklet code ({tasklet.label})" in code and "tanh(" in code and "exp(" in code
        assert code.strip().startswith("{") and code.endswith("}")
        # the map: its loops, around the tasklet, from the entry's first line to the exit's last
        loops = _code(source, entry)
        assert len(re.findall(r"for \(int __i\d = 0;", loops)) == 4
        assert code in loops and loops.count("{") == loops.count("}")
        assert source["nodes"][_only(sdfg, nodes.MapExit).guid] == source["nodes"][entry.guid]


def test_a_step_s_code_is_worked_out_once_and_kept_in_its_analysis(fused_mish):
    found = sources.of(fused_mish)
    assert sources.of(fused_mish) is found and fused_mish.analysis().known("sources") is found


def test_the_overlays_count_library_nodes_on_the_copy_the_code_is_read_from(monkeypatch):
    # expanding a transformer layer's library nodes takes seconds: the code view and the overlays share it
    session = dcnb.optimize(torch.nn.LayerNorm(6), torch.rand(3, 7, 6), baselines=(), time_budget=0.0)
    forward = session.forward_sdfg
    assert any(isinstance(n, nodes.LibraryNode) for n, _ in forward.all_nodes_recursive())
    generated, own = [], []
    real = codegen.generate_code
    monkeypatch.setattr(codegen, "generate_code", lambda sdfg, **k: generated.append(sdfg) or real(sdfg, **k))
    monkeypatch.setattr(overlays, "_expand_unknown", lambda sdfg: own.append(sdfg))
    found = overlays.of(session)
    code = sources.of(session)
    assert len(generated) == 2 and own == []  # once per SDFG, for both views
    library = [n.guid for n, _ in forward.all_nodes_recursive() if isinstance(n, nodes.LibraryNode)]
    assert all("flops" in found["forward"][g] for g in library) and all(g in code["forward"]["nodes"] for g in library)


def _every_node_points_at_its_code(session: dcnb.Session) -> None:
    found = sources.of(session)
    for sdfg, source in zip(session.compiled_sdfgs(), (found["forward"], found["backward"])):
        lines = source["text"].split("\n")
        for node, _ in sdfg.all_nodes_recursive():
            if not isinstance(node, CODE):
                continue
            assert node.guid in source["nodes"], (sdfg.name, type(node).__name__, node.label)
            first, last = source["nodes"][node.guid]
            assert 1 <= first <= last < len(lines) and not lines[first - 1].startswith("// ---- ")
            code = _code(source, node)
            assert code.count("{") == code.count("}"), (node.label, code)
            if isinstance(node, nodes.Tasklet) and node.language == dace.Language.Python:
                assert f"// Tasklet code ({node.label})" in code, (node.label, first, last)
            if isinstance(node, nodes.LibraryNode):
                # its expansion, generated as a function of its own (identical ones share one)
                assert re.match(r"\s*inline void \w+\(", lines[first - 1]), (node.label, lines[first - 1])


def test_every_node_of_the_mlp_points_at_its_code():
    # library nodes (Gemm's Einsum, LayerNorm, the loss) expand into functions; LayerNorm's two reductions share one
    module, inputs = CASES["mlp"].build()
    _every_node_points_at_its_code(dcnb.optimize(module, *inputs, baselines=(), time_budget=0.0))


def test_every_node_of_the_transformer_layer_points_at_its_code(transformer_session):
    # the backward's two LayerNorm gradients are nested SDFGs of library nodes: the second calls the first's code
    _every_node_points_at_its_code(transformer_session)


def test_code_that_differs_from_the_build_gets_no_ranges(fused_mish, tmp_path):
    # a file edited after the build (or generated by another DaCe) is shown as it is, with no ranges into it
    sdfg = fused_mish.forward_sdfg
    built = pathlib.Path(sdfg.build_folder)
    for name in ("dace_files.csv", "dace.conf", "src"):
        copy = shutil.copytree if (built / name).is_dir() else shutil.copy
        copy(built / name, tmp_path / name)
    (cpp,) = (tmp_path / "src").rglob("*.cpp")
    cpp.write_text("// edited\n" + cpp.read_text())
    source = sources.generated(sdfg, tmp_path)
    assert "// edited\n" in source["text"] and source["nodes"] == {}


def test_a_build_folder_that_is_gone_is_named(fused_mish, tmp_path):
    # (named as the graphs name it, not by its build key)
    with pytest.raises(dcnb.DcnbError, match="no generated code for Mish in .*build folder is gone"):
        sources.generated(fused_mish.forward_sdfg, tmp_path / "gone")


def test_a_cuda_build_points_a_map_at_its_kernel(fused_mish):
    # built for the H100 with nvcc (no GPU here), as tests/compile/test_cuda_build.py builds it
    assert shutil.which("nvcc"), "nvcc belongs to the build environment"
    program = fused_mish._states[-1].sdfgs  # the SDFGs before the CPU build's passes
    with temporary_config():
        Config.set("compiler", "cuda", "cuda_arch", value="90")
        built = build.build([program.forward, program.backward], "cuda")
    for sdfg in built.sdfgs:
        source = sources.generated(sdfg)
        assert source["language"] == "cuda"
        headers = re.findall(r"^// ---- src/(\w+)/\w+\.(\w+) ----$", source["text"], re.MULTILINE)
        assert headers == [("cpu", "cpp"), ("cuda", "cu")]
        kernel = _code(source, _only(sdfg, nodes.MapEntry))
        # the kernel (a map over blocks DaCe put around the map, now over a block's threads), not its launch
        assert kernel.startswith("__global__ void") and kernel.endswith("}")
        assert _code(source, _only(sdfg, nodes.Tasklet)) in kernel and "tanh(" in kernel
