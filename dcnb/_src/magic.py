"""``%%dcoptimize``: run a cell that defines an nn.Module, build its session, show the widget, bind a variable.

Bad input raises IPython's UsageError with one paragraph naming the cause (no traceback), after the cell has run,
so its definitions stay. A compile failure also shows the compiler's log, folded.
"""

from __future__ import annotations

import contextvars
import html
import importlib.util
import json
import keyword
import pathlib
import re
import threading
import time
from typing import Any

import torch
from IPython.core.error import UsageError
from IPython.core.getipython import get_ipython
from IPython.core.magic import Magics, cell_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments
from IPython.display import display
from torch import nn

from . import cuda_check, probe
from .views import formatters
from .errors import CompileError, DcnbError, InputError, describe
from .recipe import Entry
from .recipe import parse as parse_recipe
from .recipe import replay as replay_recipe
from .record import BASELINES


@magics_class
class DcnbMagics(Magics):
    @magic_arguments()
    @argument("--inputs", metavar="EXPR", nargs="+", help="example inputs: a tensor or a tuple of tensors (their shapes are compiled in)")
    @argument(
        "--kwargs",
        metavar="EXPR",
        nargs="+",
        default=[],
        help="keyword inputs, as in a call: 'attention_mask=mask, return_dict=False' (tensors are inputs, other values compiled in)",
    )
    @argument("--class", dest="cls", metavar="NAME", help="the nn.Module class to optimize, if the cell defines several")
    @argument("--args", metavar="EXPR", nargs="+", default=[], help="constructor arguments, as in a call: '16, bias=False'")
    @argument("--no-backward", action="store_true", help="build the forward pass only")
    @argument("--training", action="store_true", help="optimize the module in training mode (dropout, batch norm)")
    @argument("--device", choices=("auto", "cpu", "cuda"), default="auto", help="where to compile and run")
    @argument("--recipe", metavar="FILE", help="a recipe (JSON, from 'Export recipe') to replay after the naive step")
    @argument(
        "--search",
        type=float,
        metavar="SECONDS",
        help="then search for a recipe for this many seconds (Session.search); the best becomes steps",
    )
    @argument(
        "--cluster",
        metavar="ADDRESS",
        help="a Dask scheduler's address (tcp://host:8786): searches, --search's and the view's, compile there",
    )
    @argument("--as", dest="variable", metavar="VAR", help="the variable for the session (default: <class>_opt)")
    @argument(
        "--baselines",
        default=",".join(BASELINES),
        metavar="LIST",
        help="what dcnb is timed against, comma-separated: torch, torch_compile (empty: nothing)",
    )
    @argument("--time-budget", type=float, default=2.0, metavar="SECONDS", help="seconds of timing per step")
    @argument(
        "--cuda-arch",
        metavar="ARCH",
        help="the GPU architecture CUDA builds are for: sm_80, sm_86, sm_89 or sm_90 (default: the GPU's, else sm_90)",
    )
    @argument(
        "--no-cuda-build",
        action="store_true",
        help="on the CPU, do not also build every step for CUDA in the background (where nvcc is present)",
    )
    @cell_magic
    def dcoptimize(self, line: str, cell: str) -> None:
        """Optimize the nn.Module this cell defines with DaCe, step by step, checked against PyTorch.

        The cell runs as usual; dcnb then picks the nn.Module subclass it defines (or ``--class``), instantiates
        it (with ``--args``), exports it with the example ``--inputs``, builds and checks the naive step, shows the
        session's widget and binds the session to a variable (``--as``; default: the class name in snake case
        with ``_opt``, e.g. ``mish_opt``).
        """
        tokens = _split(line)
        try:
            args, bad_line = self.dcoptimize.parser.parse_args(tokens), None
        except UsageError as e:  # said after the cell has run, so that its definitions are there all the same
            args, bad_line = None, _unparsed(str(e), tokens)
        shell = self.shell
        before = dict(shell.user_ns)
        result = shell.run_cell(cell)
        if not result.success:
            # the cell's own error is shown above, as for any cell; the cell still fails, so "run all" stops
            raise UsageError("The cell raised an error (above), so there is nothing to optimize yet.")
        if args is None:
            raise UsageError(bad_line)
        # an expression may have spaced out into several arguments
        args.inputs = None if args.inputs is None else " ".join(args.inputs)
        args.args = " ".join(args.args)
        args.kwargs = " ".join(args.kwargs)
        _check_options(args)
        cls = _pick_class(before, shell.user_ns, args.cls)
        variable = args.variable or _snake(cls.__name__) + "_opt"
        _check_variable(variable, shell.user_ns, given=args.variable is not None)
        inputs = _inputs(args.inputs, shell.user_ns, cls)
        kwargs = _keywords(args.kwargs, shell.user_ns)
        module = _instantiate(cls, args.args, shell.user_ns)
        recipe = _recipe(args.recipe) if args.recipe else []
        baselines = tuple(b.strip() for b in args.baselines.split(",") if b.strip())
        return _build(
            cls.__name__,
            module,
            inputs,
            variable,
            shell.user_ns,
            recipe=recipe,
            kwargs=kwargs,
            backward=not args.no_backward,
            training=args.training,
            device=args.device,
            baselines=baselines,
            time_budget=args.time_budget,
            cuda_build=False if args.no_cuda_build else None,
            cuda_arch=args.cuda_arch,
            search=args.search,
            cluster=args.cluster,
        )


def _build(
    name: str,
    module: nn.Module,
    inputs: tuple[torch.Tensor, ...],
    variable: str,
    namespace: dict[str, Any],
    *,
    recipe: list[Entry],
    search: float | None = None,
    cluster: str | None = None,
    **options: Any,
) -> None:
    from .session import optimize
    from .views.widget import Progress, SessionWidget

    line = _ProgressLine(name)
    progress = Progress(line)
    try:  # (the line goes however the cell ends: built, failed or stopped)
        try:
            session = optimize(module, *inputs, progress=progress, **options)
        except CompileError as e:
            _show_log(e.log)
            raise UsageError(f"{name}: {e} (the compiler's log is above).") from None
        except DcnbError as e:
            # where the user's forward raised on the example inputs, the line that did
            cause = e.__cause__ if isinstance(e, InputError) else None
            where = "" if cause is None else probe.user_line(cause.__traceback__)
            text = str(e) if str(e).startswith(name) else f"{name}: {e}"  # (not "Mish: Mish has ...")
            raise UsageError(text + where) from None
        except Exception as e:  # a crash inside the exporter or DaCe: still one paragraph, naming where to look
            raise UsageError(
                f"{name}: building the session failed inside PyTorch or DaCe ({describe(e)}). "
                "Call dcnb.optimize(module, *inputs) in a cell to see the traceback."
            ) from None
        failed = None
        try:
            replay_recipe(
                session, recipe, lambda i, entry: line(f"replaying step {i + 1} of {len(recipe)}: {entry.name}")
            )
        except DcnbError as e:
            failed = str(e)
        try:
            found = session.search(search, cluster=cluster) if search is not None and failed is None else None
        except DcnbError as e:  # (a cluster that does not answer): the session stands, its view shows
            found, failed = None, str(e)
        line("drawing the session's graphs")
        namespace[variable] = session
        widget = SessionWidget(session, variable=variable, progress=progress, cluster=cluster)
        if found is not None:
            widget.record_search(found)
        widget.display_id = display(widget, display_id=True).display_id
    finally:
        line.close()
    if failed:
        raise UsageError(f"{failed}. The session {variable} holds the steps before it.")
    return None


class _ProgressLine:
    """One line that says what the build is doing now, for how long, and for how long in all; it disappears when
    done. In a kernel it ticks each second, from a thread of its own, so that a long phase (a compile) shows that
    it goes on; elsewhere (a terminal, which prints each update as a new line) it changes with the phase only."""

    def __init__(self, name: str):
        self.name = name
        self._start = self._since = time.perf_counter()
        self._phase = "starting"
        self._lock = threading.Lock()  # the phase and its start, set by the cell, read by the ticker
        self._woken = threading.Event()  # a new phase, or the end
        self._closed = False
        self.handle = display({"text/plain": self._text()}, raw=True, display_id=True)
        self._ticker: threading.Thread | None = None
        if self.handle is not None and getattr(get_ipython(), "kernel", None) is not None:
            # in the cell's context: ipykernel 7 keeps the request being executed in a context variable; a thread
            # started without it sends as the last request the kernel took, which another subshell's may be
            self._ticker = threading.Thread(
                target=contextvars.copy_context().run, args=(self._tick,), name="dcnb progress line", daemon=True
            )
            self._ticker.start()

    def __call__(self, message: str) -> None:
        with self._lock:
            self._phase, self._since = message, time.perf_counter()
        if self._ticker is None:
            self._show()
        else:
            self._woken.set()  # the ticker alone updates the line while it runs

    def close(self) -> None:
        """Stop the ticker and empty the line; a message after this is dropped."""
        if self.handle is None:
            return
        self._closed = True
        self._woken.set()
        if self._ticker is not None:
            self._ticker.join()
        self.handle.update({"text/plain": ""}, raw=True)
        self.handle = None

    def _tick(self) -> None:
        while not self._closed:
            self._show()
            with self._lock:
                into_second = (time.perf_counter() - self._since) % 1
            # at the phase's next whole second (a little after, as a wait may end early), or at its end
            self._woken.wait(1 - into_second + 0.02)
            self._woken.clear()

    def _show(self) -> None:
        if self.handle is not None:
            self.handle.update({"text/plain": self._text()}, raw=True)

    def _text(self) -> str:
        now = time.perf_counter()
        with self._lock:
            phase, since = self._phase, self._since
        this, spent = int(now - since), f"{int(now - self._start)} s in all"
        return f"dcnb: {self.name}: {phase} ({f'{this} s in this phase, ' if this else ''}{spent})"


def _unparsed(message: str, tokens: list[str]) -> str:
    """argparse's complaint about the magic's line, as one sentence that names the option."""
    flags = ("--no-backward", "--training", "--no-cuda-build")
    extra = message.removeprefix("unrecognized arguments: ").split() if message.startswith("unrecognized") else []
    for flag in flags:
        if flag in tokens and tokens.index(flag) + 1 < len(tokens) and tokens[tokens.index(flag) + 1] in extra:
            return f"{flag} takes no value (got {tokens[tokens.index(flag) + 1]!r}): it is on where it is given."
    return f"%%dcoptimize: {message} (%%dcoptimize? lists the options)."


def _check_options(args: Any) -> None:
    """What the parser lets through: a time budget that is no budget, baselines that are none, a missing GPU."""
    budget = args.time_budget
    if not 0 <= budget < float("inf"):
        raise UsageError(f"--time-budget {budget:g}: give the seconds of timing per step, e.g. 2 (0: the fewest runs).")
    if args.search is not None and not 0 < args.search < float("inf"):
        raise UsageError(f"--search {args.search:g}: give the seconds the search may take, e.g. 300.")
    if args.cluster is not None and importlib.util.find_spec("distributed") is None:
        raise UsageError("--cluster: a search on a cluster needs Dask's distributed scheduler: pip install 'dcnb[cluster]'.")
    for b in (b.strip() for b in args.baselines.split(",")):
        if b and b not in BASELINES:
            raise UsageError(f"--baselines: {b!r} is not a baseline; choose from {', '.join(BASELINES)} (or '' for none).")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: PyTorch sees no CUDA device here; use --device cpu (or auto, which picks one).")
    if args.cuda_arch is not None:
        try:
            cuda_check.arch(args.cuda_arch, option="--cuda-arch")
        except InputError as e:
            raise UsageError(f"{e}.") from None


def _check_variable(variable: str, namespace: dict[str, Any], *, given: bool) -> None:
    """The session's variable must be a name, and must not replace anything but an earlier session."""
    from .session import Session

    option = f"--as {variable}" if given else f"The session's variable {variable}"
    if not variable.isidentifier():
        raise UsageError(f"{option}: {variable!r} is not a Python identifier.")
    if keyword.iskeyword(variable):
        raise UsageError(f"{option}: {variable!r} is a Python keyword, which no variable can be named.")
    held = namespace.get(variable)
    if held is not None and not isinstance(held, Session):
        raise UsageError(
            f"{option} would replace {variable} (a {type(held).__name__}) in the notebook; "
            + ("choose another name." if given else "name the session's variable with --as VAR.")
        )


def _pick_class(before: dict[str, Any], after: dict[str, Any], wanted: str | None) -> type[nn.Module]:
    if wanted is not None:
        cls = after.get(wanted)
        if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
            raise UsageError(f"--class {wanted}: the notebook has no nn.Module subclass named {wanted}.")
        return cls
    defined = [
        v
        for k, v in after.items()
        if isinstance(v, type) and issubclass(v, nn.Module) and before.get(k) is not v and not k.startswith("_")
    ]
    if not defined:
        raise UsageError(
            "The cell defines no torch.nn.Module subclass: %%dcoptimize optimizes the module class its cell "
            "defines (or the one named with --class)."
        )
    if len(defined) > 1:
        names = ", ".join(sorted(c.__name__ for c in defined))
        raise UsageError(f"The cell defines several nn.Module classes ({names}); choose one with --class NAME.")
    return defined[0]


def _inputs(expr: str | None, namespace: dict[str, Any], cls: type) -> tuple[torch.Tensor, ...]:
    if expr is None:
        raise UsageError(
            f"{cls.__name__} needs example inputs: add --inputs EXPR, e.g. --inputs 'torch.rand(8, 32)' "
            "(their shapes are compiled in)."
        )
    try:
        value = eval(expr, namespace)  # noqa: S307 (the user's own expression, as in any cell)
    except Exception as e:
        raise UsageError(f"--inputs {expr!r} does not evaluate: {type(e).__name__}: {e}") from None
    values = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    if not values:
        raise UsageError(f"--inputs {expr!r} gives no inputs; {cls.__name__} needs at least one example tensor.")
    for i, v in enumerate(values):
        if not isinstance(v, torch.Tensor):
            raise UsageError(
                f"--inputs {expr!r}: input {i} is a {type(v).__name__}; the example inputs must be torch tensors."
            )
    return values


def _keywords(expr: str, namespace: dict[str, Any]) -> dict[str, Any]:
    if not expr:
        return {}
    try:
        return eval(f"(lambda **k: k)({expr})", namespace)  # noqa: S307 (the user's own expression, as in any cell)
    except Exception as e:
        raise UsageError(
            f"--kwargs {expr!r} does not evaluate as keyword arguments (name=value, ...): {type(e).__name__}: {e}"
        ) from None


def _instantiate(cls: type[nn.Module], args: str, namespace: dict[str, Any]) -> nn.Module:
    try:
        positional, keywords = eval(f"(lambda *a, **k: (a, k))({args})", namespace)  # noqa: S307
    except Exception as e:
        raise UsageError(f"--args {args!r} does not evaluate as call arguments: {type(e).__name__}: {e}") from None
    try:
        return cls(*positional, **keywords)
    except Exception as e:
        raise UsageError(
            f"{cls.__name__}({args}) failed: {describe(e)}"
            + ("" if args else " (pass constructor arguments with --args)")
        ) from None


def _recipe(path: str) -> list[Entry]:
    try:
        data = json.loads(pathlib.Path(path).read_text())
    except OSError as e:
        raise UsageError(f"--recipe {path}: cannot read it ({e.strerror}).") from None
    except json.JSONDecodeError as e:
        raise UsageError(f"--recipe {path} is not JSON: {e}.") from None
    try:
        entries = parse_recipe(data)
    except DcnbError as e:
        raise UsageError(f"--recipe {path} is not a recipe: {e}.") from None
    from .actions import REGISTRY  # (imports DaCe: not before a recipe is asked for)

    for i, entry in enumerate(entries):
        if entry.name not in REGISTRY:
            raise UsageError(
                f"--recipe {path}: step {i + 1} is {entry.name!r}, which is not an action of this dcnb; "
                f"the actions are {', '.join(REGISTRY)}."
            )
    return entries


def _split(line: str) -> list[str]:
    """The magic's line as arguments: whitespace separates them except inside quotes or brackets, so that
    ``--inputs torch.rand(2, 8)`` is one expression; quotes around a whole argument are dropped."""
    tokens: list[str] = []
    current: list[str] = []
    depth, quote = 0, ""
    for ch in line:
        if quote:
            quote = "" if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(depth - 1, 0)
        elif ch.isspace() and depth == 0:
            if current:
                tokens.append("".join(current))
                current = []
            continue
        current.append(ch)
    if current:
        tokens.append("".join(current))
    return [t[1:-1] if len(t) >= 2 and t[0] == t[-1] and t[0] in "'\"" else t for t in tokens]


def _snake(name: str) -> str:
    words = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    words = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", words)
    return words.lower()


def _show_log(log: str) -> None:
    display(
        {
            "text/plain": log,
            "text/html": "<details><summary>compiler log</summary><pre>" + html.escape(log) + "</pre></details>",
        },
        raw=True,
    )


def load_ipython_extension(ipython: Any) -> None:
    ipython.register_magics(DcnbMagics)
    formatters.register(ipython)
