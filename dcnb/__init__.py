"""dcnb: optimize PyTorch modules step by step with DaCe, checked against PyTorch at every step."""

# first, so that nothing imports DaCe before it: DaCe shows a 7 MB script in the notebook that imports it
from dcnb._src import quiet_dace as _quiet_dace  # noqa: F401
from dcnb._src.errors import CompileError as CompileError
from dcnb._src.errors import DcnbError as DcnbError
from dcnb._src.errors import InputError as InputError
from dcnb._src.errors import UnsupportedOpError as UnsupportedOpError
from dcnb._src.module import DcnbModule as DcnbModule
from dcnb._src.record import Step as Step
from dcnb._src.search import SearchResult as SearchResult
from dcnb._src.session import Session as Session
from dcnb._src.session import optimize as optimize
from dcnb._src.session import replay as replay
from dcnb._src.version import VERSION as __version__



def load_ipython_extension(ipython) -> None:
    """``%load_ext dcnb``: registers the ``%%dcoptimize`` cell magic."""
    from dcnb._src.magic import load_ipython_extension as load  # IPython is needed only here

    load(ipython)


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    return [{"src": "labextension", "dest": "dcnb"}]


__all__ = [
    "CompileError",
    "DcnbError",
    "DcnbModule",
    "InputError",
    "SearchResult",
    "Session",
    "Step",
    "load_ipython_extension",
    "UnsupportedOpError",
    "optimize",
    "replay",
]
