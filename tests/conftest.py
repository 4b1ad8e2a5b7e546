import inspect
import os
import pathlib
import shutil

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
# builds are cached by content: reruns of the suite reuse them (tests that count builds use their own cache)
os.environ.setdefault("DCNB_CACHE", str(ROOT / ".cache" / "dcnb-test"))
# a CUDA build of every step in the background would take a minute each here: the tests that want it ask for it
os.environ.setdefault("DCNB_CUDA_BUILD", "0")
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
# what works in this sandbox: no GPU, no sandboxing, nothing fetched from the network
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@pytest.fixture
def calls(monkeypatch):
    """``calls(owner, name, *also)``: ``owner.name`` (and the same function where modules in ``also`` imported it)
    replaced by a wrapper that counts its calls, for the test; returns the list the calls are counted into. A
    property of a class is counted per read."""

    def count(owner, name: str, *also) -> list:
        counted, original = [], inspect.getattr_static(owner, name)
        if isinstance(original, property):
            monkeypatch.setattr(owner, name, property(lambda obj: counted.append(1) or original.fget(obj)))
            return counted
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            counted.append(1)
            return original(*args, **kwargs)

        for where in (owner, *also):
            monkeypatch.setattr(where, name, wrapper)
        return counted

    return count


@pytest.fixture
def scope_walks(monkeypatch):
    """The states whose scope dictionary was worked out from scratch (DaCe's walk from their source nodes), once each
    time."""
    from dace.sdfg import scope

    walks, original = [], scope._scope_dict_inner

    def counted(graph, queue, current, *args):
        if current is None:
            walks.append(graph)
        return original(graph, queue, current, *args)

    monkeypatch.setattr(scope, "_scope_dict_inner", counted)
    return walks


@pytest.fixture
def fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("DCNB_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.fixture(scope="session")
def transformer_session():
    """The zoo's transformer layer at its naive step, one for the views' tests over a whole layer (its generated
    code, its metrics): each works out the same expanded copy, which a session keeps for the other."""
    import dcnb
    from tests.zoo import CASES

    module, inputs = CASES["transformer"].build()
    return dcnb.optimize(module, *inputs, baselines=(), time_budget=0.0)


@pytest.fixture(scope="session")
def ip():
    """A real IPython shell with dcnb's extension loaded (the magic's tests)."""
    from IPython.testing.globalipapp import start_ipython

    shell = start_ipython()
    shell.run_line_magic("load_ext", "dcnb")
    shell.run_cell("import torch\nfrom torch import nn")
    return shell


@pytest.fixture(scope="session")
def browser(tmp_path_factory):
    from playwright.sync_api import sync_playwright

    assert pathlib.Path(CHROMIUM).exists(), "Debian's chromium is needed (scripts/setup.sh installs it)"
    with sync_playwright() as p:
        context = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")),
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1400, "height": 1100},
        )
        yield context
        context.close()


@pytest.fixture
def artifacts():
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS


#: markers whose tests run only with their option: the rest of the model zoo (--zoo), the Hugging Face models
#: beyond the default one (--models), the op catalog beyond its representative set (--ops), each tens of minutes;
#: the notebooks beyond the tutorial and the search (--notebooks), the CUDA builds beyond Mish's (--cuda), more cases
#: of what the default suite checks once (--deep); what runs on a GPU (--gpu; make gpu)
GATED = {
    "zoo": "--zoo", "models": "--models", "ops": "--ops", "notebooks": "--notebooks", "cuda": "--cuda",
    "deep": "--deep", "gpu": "--gpu",
}


def pytest_addoption(parser):
    parser.addoption("--zoo", action="store_true", help="also run the whole model zoo (tests marked zoo; make zoo)")
    parser.addoption(
        "--models", action="store_true",
        help="also run every Hugging Face model in every mode (tests marked models; make models)",
    )
    parser.addoption("--ops", action="store_true", help="also run every op of the catalog (tests marked ops; make ops)")
    parser.addoption(
        "--notebooks", action="store_true", help="also run every notebook (tests marked notebooks; make notebooks)"
    )
    parser.addoption(
        "--cuda", action="store_true", help="also build more graphs for CUDA (tests marked cuda; make cuda)"
    )
    parser.addoption(
        "--deep", action="store_true",
        help="also run more cases of what the default suite checks once (tests marked deep; make deep)",
    )
    parser.addoption(
        "--gpu", action="store_true", help="also run what needs a GPU and a CUDA PyTorch (tests marked gpu; make gpu)"
    )


def pytest_collection_modifyitems(config, items):
    """Tests marked ``zoo`` run only with --zoo, ``models`` only with --models, and so on (GATED)."""
    skipped = [marker for marker, option in GATED.items() if not config.getoption(option)]
    gated = [item for item in items if any(item.get_closest_marker(marker) for marker in skipped)]
    if gated:
        config.hook.pytest_deselected(items=gated)
        items[:] = [item for item in items if item not in gated]
