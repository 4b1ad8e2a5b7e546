"""Session: a module's SDFGs and the history of the steps applied to them. It has no UI."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import dace
import torch
from torch import nn

from . import build as builder
from . import fixes  # noqa: F401  (installs the fixes for DaCe gaps)
from . import actions, alone, arguments, cuda_check, dace_internals, diff, events, forked, native, passes, probe
from . import program, timing, torch_kernels, verify, workdir
from . import search as search_module
from .analysis import Analysis
from .errors import DcnbError, InputError, StepError, check, describe
from .frontend import Imported, import_module
from .module import MAX_BUILDS, Again, DcnbModule, OneBuild, Runner, Signature, Variant, first_floating
from .program import Program
from .recipe import Entry
from .recipe import parse as parse_recipe
from .recipe import replay as replay_recipe
from .record import BASELINES, Step, history_table, slower_note
from .structure import Call


@dataclasses.dataclass
class _State:
    """A good state of the session: the SDFGs before and after autodiff, compiled and loaded."""

    pre: dace.SDFG
    #: the forward and backward SDFGs that actions transform
    sdfgs: Program
    #: the forward and backward SDFGs as compiled (after the device's build passes): what runs and what views draw
    compiled: tuple[dace.SDFG, dace.SDFG | None]
    runner: Runner
    applied: tuple[Entry, ...]
    step: Step
    #: what the views worked out of the state (its overlays, code, profile): it lives and goes with the state
    analysis: Analysis
    #: the builds of this state by signature: the example's, and those other calls of Session.module made
    variants: dict[Signature, Variant]


@dataclasses.dataclass(frozen=True)
class Calls:
    """What an instrumented run of the current step takes from a session (profile.py): its compiled SDFGs, what a
    Runner is made of, and the calls the session times a step with, so that the run is timed as a step is."""

    device: str
    #: the forward and backward SDFGs as compiled (views draw them; the profile times copies of them)
    compiled: tuple[dace.SDFG, dace.SDFG | None]
    program: Program
    imported: Imported
    #: forward and backward through the compiled module a runner makes, as a step is timed
    timed: Callable[[Runner], Callable[[], None]]
    #: forward and backward through PyTorch eager, as its baseline is timed
    eager: Callable[[], None]
    #: a block that leaves the user's module as it was and runs no background CUDA build (as the session's timing)
    preserved: Callable[[], contextlib.AbstractContextManager]


class Session:
    """An optimization session over one module and its example inputs. Build one with ``dcnb.optimize``."""

    def __init__(
        self,
        module: nn.Module,
        inputs: Sequence[torch.Tensor],
        *,
        kwargs: Mapping[str, Any] | None = None,
        backward: bool = True,
        training: bool = False,
        device: str = "auto",
        baselines: Iterable[str] = BASELINES,
        time_budget: float = 1.0,
        progress: Callable[[str], None] | None = None,
        cuda_build: bool | None = None,
        cuda_arch: str | None = None,
    ):
        arguments.time_budget(time_budget)
        self._setup(module, inputs, kwargs, backward, training, device, baselines, progress, cuda_build, cuda_arch)
        # dcnb never changes the user's objects: what the export, the checks and the timing do to the module
        # (gradients, BatchNorm's statistics, the training flag) is undone, here and in every step
        with verify.preserved(self._module, training), workdir.untouched():
            self._start(baselines, time_budget)

    @classmethod
    def _built_at(
        cls,
        module: nn.Module,
        inputs: Sequence[torch.Tensor],
        kwargs: Mapping[str, Any],
        recipe: tuple[Entry, ...],
        *,
        backward: bool,
        training: bool,
        device: str,
        progress: Callable[[str], None] | None = None,
    ) -> Session:
        """A session built straight at ``recipe`` (one build, checked against PyTorch, not timed): the build of
        another signature of a session's module, or of a copy of it."""
        self = cls.__new__(cls)
        self._setup(module, inputs, kwargs, backward, training, device, (), progress, False, None, timed=False)
        with verify.preserved(self._module, training), workdir.untouched():
            self._start((), 0.0, recipe)
        return self

    def _setup(
        self,
        module: nn.Module,
        inputs: Sequence[torch.Tensor],
        kwargs: Mapping[str, Any] | None,
        backward: bool,
        training: bool,
        device: str,
        baselines: Iterable[str],
        progress: Callable[[str], None] | None,
        cuda_build: bool | None,
        cuda_arch: str | None,
        timed: bool = True,
    ) -> None:
        self._call = arguments.call(module, inputs, kwargs or {})
        inputs = arguments.example_inputs(module, self._call.tensors(inputs, kwargs or {}))
        self.device = arguments.device(device)
        arguments.cuda_build(cuda_build)
        #: the architecture CUDA builds are for where one was named (else the GPU's own, or sm_90 without one)
        self._cuda_arch = None if cuda_arch is None else cuda_check.arch(cuda_arch)
        # on a GPU the steps' own builds are the CUDA builds: none in the background then
        self._cuda_builds: cuda_check.Builds | None = None
        if self.device == "cpu" and cuda_check.enabled(cuda_build):
            self._cuda_builds = cuda_check.Builds(self._cuda_arch or cuda_check.default_arch())
            weakref.finalize(self, self._cuda_builds.close)  # (and at exit): no compile outlives its session
        # what the export would get wrong without a word: a write into an input, a branch on a tensor's values
        probe.check_forward(
            module, inputs, backward=backward, training=training, invoke=self._call.invoke, keywords=self._call.keywords
        )
        if self.device == "cpu":
            native.start()  # built (once per machine) while this session exports and compiles
            if any(isinstance(m, nn.modules.conv._ConvNd) for m in module.modules()):
                torch_kernels.start()  # on the other core while this session exports, imports and differentiates
        # the user's module runs where the compiled code runs, so that they share parameters
        self._module = module.to(self.device)
        self._inputs = [t.to(self.device) for t in inputs]
        self.backward = backward
        self.training = training
        baselines = tuple(baselines)
        for b in baselines:
            check(b in BASELINES, f"unknown baseline {b!r}; choose from {', '.join(BASELINES)}")
        self._report = progress or (lambda message: None)
        #: what the session is doing now, as its progress callback last heard it (a cancelled step names it)
        self._phase = "starting"
        self._history: list[Step] = []
        self._states: list[_State] = []
        self._timed = timed
        #: Session.module: one object, following the current step
        self._compiled: DcnbModule | None = None

    def _start(self, baselines: tuple[str, ...], time_budget: float, recipe: tuple[Entry, ...] = ()) -> None:
        """Run PyTorch eager for the reference, export and import the module, and build step 0 (naive), or the
        state of ``recipe`` at once."""
        self._progress("running PyTorch eager")
        outputs, self._result = verify.eager(self._module, self._inputs, self._call)
        self._progress("exporting to ONNX")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self._imported: Imported = import_module(
                self._module,
                tuple(self._inputs),
                training=self.training,
                call=self._call,
                progress=self._progress,
                uneven_pads=self.device == "cpu",
            )
            pre = copy.deepcopy(self._imported.sdfg)
            passes.run(passes.ON_IMPORT, pre)
        if self.device == "cpu" and torch_kernels.may_call(pre):
            torch_kernels.start()  # convolutions called as functions (F.conv2d): found in the graph only
        self._reference = verify.Reference(
            self._module,
            self._inputs,
            self._call,
            outputs,
            self._imported.all_inputs,
            backward=self.backward,
            training=self.training,
        )
        self._baselines = timing.Baselines(baselines, self._reference, self.device, time_budget, self._progress)
        before = tuple(a for a in recipe if actions.get(a.name).before_autodiff)
        kept = tuple(a for a in before if _run(actions.get(a.name), pre, a, self.device, strict=False))
        state = self._make_state(pre, kept, replay=tuple(a for a in recipe if a not in before))
        self._states.append(state)
        self._history.append(state.step)

    # --- what the session holds ---------------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self._imported.name

    @property
    def forward_sdfg(self) -> dace.SDFG:
        """The forward SDFG as compiled and run now: after autodiff (which made the stored intermediates its
        outputs) and the device's build passes."""
        return self._states[-1].compiled[0]

    @property
    def backward_sdfg(self) -> dace.SDFG | None:
        """The backward SDFG as compiled and run now (None without a backward)."""
        return self._states[-1].compiled[1]

    def compiled_sdfgs(self, index: int | None = None) -> tuple[dace.SDFG, dace.SDFG | None]:
        """The forward and backward SDFGs as compiled at good step ``index`` (the current step by default): what
        the views draw for a step of the history."""
        return self._good(index).compiled

    def previous_step(self, index: int | None = None) -> int | None:
        """The good step that step ``index`` (the current by default) was made from; None for the naive step."""
        states = [s.step.index for s in self._states]
        position = states.index(self._good(index).step.index)
        return states[position - 1] if position else None

    def analysis(self, index: int | None = None) -> Analysis:
        """What the views worked out of good step ``index`` (the current step by default): its overlays, its
        generated code, its profile, each worked out once and kept while the step is in the session."""
        return self._good(index).analysis

    def _good(self, index: int | None) -> _State:
        if index is None:
            return self._states[-1]
        for state in self._states:
            if state.step.index == index:
                return state
        good = ", ".join(str(s.step.index) for s in self._states)
        raise DcnbError(f"step {index} is not a good step of the current state (good steps: {good})")

    def calls(self) -> Calls:
        """The current step's SDFGs and the session's timed calls, for a run of the step outside its timing
        (profile.py)."""
        state = self._states[-1]
        return Calls(
            device=self.device,
            compiled=state.compiled,
            program=state.sdfgs,
            imported=self._imported,
            timed=lambda runner: self._baselines.call(self._dcnb_module(runner)),
            eager=self._baselines.call(self._module),
            preserved=lambda: _timed_alone(self._module, self.training),
        )

    @property
    def pre_autodiff_sdfg(self) -> dace.SDFG:
        """The forward SDFG before autodiff: what transformations that act before autodiff see."""
        return self._states[-1].pre

    @property
    def history(self) -> list[Step]:
        """Every step tried since the last reset, failed ones included (step 0 is the naive build)."""
        return list(self._history)

    @property
    def current(self) -> Step:
        """The step whose SDFGs the session holds now."""
        return self._states[-1].step

    @property
    def recipe(self) -> list[dict[str, Any]]:
        """The steps that built the current state, as JSON-serialisable data for ``dcnb.replay``."""
        return [a.to_json() for a in self._states[-1].applied]

    @property
    def module(self) -> DcnbModule:
        """An nn.Module running the current step's compiled SDFGs, sharing the user module's parameters: one object
        per session, following its current step. A call of another signature (shapes, mode, dtype) builds for it
        on first use, checked against PyTorch on that call's inputs."""
        if self._compiled is None:
            self._compiled = DcnbModule(self._module, _Builds(self), self.training)
        return self._compiled

    def _variant_for(self, signature: Signature, tensors: list[torch.Tensor]) -> Variant:
        """The current step's build for ``signature``: made on first use (from the user's module, whatever copy of
        it calls: they share one architecture) and kept with the step."""
        state = self._states[-1]
        found = state.variants.get(signature)
        if found is None:
            if len(state.variants) >= MAX_BUILDS:
                raise InputError(
                    f"{self.name} has {len(state.variants)} builds at this step already ({_signatures(state)}); "
                    f"dcnb makes at most {MAX_BUILDS}, as each is a compile: call it with fewer shapes (pad the "
                    f"last batch), or optimize again for {signature}"
                )
            found = state.variants[signature] = self._build_variant(state, signature, tensors)
        return found

    def _portable(self) -> Rebuild:
        """What a copy or pickle of Session.module carries: the example call and the current recipe."""
        n = self._call.positional
        kwargs = {**dict(zip(self._call.keywords, self._inputs[n:])), **self._call.constants}
        applied = self._states[-1].applied
        return Rebuild(self._call, list(self._inputs[:n]), kwargs, applied, self.backward, self.training, self.device)

    def _build_variant(self, state: _State, signature: Signature, tensors: list[torch.Tensor]) -> Variant:
        n = self._call.positional
        kwargs = {**dict(zip(self._call.keywords, tensors[n:])), **self._call.constants}
        self._progress(f"building {self.name} for {signature}")
        try:
            other = Session._built_at(
                self._module,
                tensors[:n],
                kwargs,
                state.applied,
                backward=self.backward,
                training=signature.training,
                device=self.device,
                progress=self._report,
            )
        except DcnbError as e:
            raise type(e)(f"building {self.name} for {signature} (a call of Session.module) failed: {e}") from e
        return next(iter(other._states[-1].variants.values()))

    # --- actions --------------------------------------------------------------------------------------------------

    def actions(self, where: Iterable[str] | None = None) -> list[actions.Action]:
        """The transformations on offer now, each with how many places it matches (``matches``; 0: not
        applicable) and, where it can list them, those places (``at``, as ``places`` lists them)."""
        where = None if where is None else tuple(where)
        # once a state, selection and set of actions: the view asks again after each request, a cancelled step's
        # too (450 ms of the 2 s a Cancel may take, on eight pre-norm blocks)
        key = f"offers {where!r} {' '.join(actions.REGISTRY)}"
        return list(self._states[-1].analysis.result(key, lambda: self._offers(where)))

    def _offers(self, where: tuple[str, ...] | None) -> list[actions.Action]:
        state = self._states[-1]
        offers = []
        for action in actions.REGISTRY.values():
            if self.device not in action.devices:
                continue
            at = self._places(action, where)
            if at is None:
                targets = _targets(action, state)
                matches = sum(_safe_count(action, s, where, {}) for s in targets)
            else:
                matches = len(at)
            offers.append(dataclasses.replace(action, matches=matches, at=None if at is None else tuple(at)))
        return offers

    def places(self, name: str, where: Iterable[str] | None = None) -> list[actions.Place]:
        """Where action ``name`` applies now, one place at a time: ``Place(side, labels, guids)``, the side
        ("forward" or "backward"), the labels of the nodes it binds there (``apply(name, where=place.labels)``
        applies it there, and a recipe keeps them) and the guids of those nodes in the current picture of that
        side (``forward_sdfg``/``backward_sdfg``: nodes sharing a label are told apart). Empty for an action that
        acts on a whole SDFG only."""
        action = actions.get(name)
        if self.device not in action.devices:
            return []
        return self._places(action, None if where is None else tuple(where)) or []

    def _places(self, action: actions.Action, where: tuple[str, ...] | None) -> list[actions.Place] | None:
        if action.places is None:
            return None
        state = self._states[-1]
        targets = _targets(action, state)
        found = []
        for side, sdfg, shown in zip(("forward", "backward"), targets, state.compiled):
            bound = _safe_places(action, sdfg, where, {})
            # the SDFG searched is not the one drawn (the build passes work on a copy, autodiff on another)
            drawn = diff.counterparts(sdfg, shown) if bound else {}
            found.extend(
                actions.Place(side, b.labels, tuple(dict.fromkeys(drawn[n] for n in b.nodes if n in drawn)))
                for b in bound
            )
        return found

    def apply(self, name: str, where: Iterable[str] | None = None, **options: Any) -> Step:
        """Apply an action, compile, check against PyTorch and time. A failed step is recorded and rolled back."""
        action = actions.get(name)
        if self.device not in action.devices:
            offered = ", ".join(action.devices)
            raise DcnbError(f"{name} is offered on {offered} only; this session runs on {self.device}")
        applied = Entry(name, dict(options), None if where is None else tuple(where))
        index = len(self._history)
        events.emit("apply")
        started = time.perf_counter()
        self._progress(f"applying {name}")
        try:
            with verify.preserved(self._module, self.training), workdir.untouched():
                state = self._advance(self._states[-1], applied, index)
        except DcnbError as e:
            log = getattr(e, "log", None)
            step = Step(index, name, applied.options, applied.where, ok=False, error=str(e), log=log)
        except Exception as e:  # a transformation that crashes must not take the session down with it
            step = Step(index, name, applied.options, applied.where, ok=False, error=f"{name} raised {describe(e)}")
        except KeyboardInterrupt:
            # an interrupt (Ctrl-C, the kernel's stop, the widget's Cancel) ends the step where it is: the compile
            # processes are stopped (build.py) and the session stays at its last good state; the caller is still
            # interrupted
            error = f"cancelled while {self._phase} after {time.perf_counter() - started:.0f} s"
            self._history.append(Step(index, name, applied.options, applied.where, ok=False, error=error))
            raise
        else:
            note = slower_note(self._states[-1].step, state.step)
            if note is not None:
                state.step = dataclasses.replace(state.step, notes=(*state.step.notes, note))
            self._states.append(state)
            step = state.step
        self._history.append(step)
        return step

    def search(
        self,
        budget: float,
        objective: str = "time",
        actions: Sequence[str | dict[str, Any]] | None = None,
        beam: int = search_module.BEAM,
        depth: int | None = None,
        seed: int = 0,
        cluster: Any = None,
        recipes: Sequence[Sequence[str | dict[str, Any]]] = (),
        places: int = search_module.PLACES,
    ) -> search_module.SearchResult:
        """Find a recipe: a beam search from the current step over sequences of ``actions`` (names, or recipe entries
        with options; default: every action on offer), each extended by every action that matches at its end, the
        ``beam`` best of each length kept, up to ``depth`` actions long (default: as long as the budget lasts), until
        ``budget`` seconds are spent (a candidate begun is finished). An action matching at 2 to ``places`` places is
        also tried at each place alone (``where``), after its level's actions whole. Every candidate is built, checked
        and timed as a step is, but kept out of the history; ``objective`` "time" ranks by dcnb's time over eager's,
        "memory" by the intermediate bytes, then time; ties are broken by ``random.Random(seed)``. On time, the few best
        are timed again together at the end with what the best is to beat, and the fastest there is the best: the start,
        ``auto_optimize`` (where it is among ``actions``) and ``recipes``. Those are recipes known before (a kept one,
        say: a list of steps as ``recipe`` gives, the start's own steps at their head or not), built first within the
        budget, each of their steps a candidate, their ends extended as the first actions' are. The best becomes
        ordinary steps (``apply`` for each of its entries); the result holds every candidate tried, failed ones with
        their reason. On time, a level whose candidates past the beam cannot be told from its last by their own
        timings has those and the beam timed together, and that run chooses the beam.

        The next candidates are transformed and their compiles started while one is checked and timed; where they
        compile: this machine's cores, or with ``cluster`` (a ``dask.distributed.Client`` or a scheduler's address,
        ``pip install dcnb[cluster]``) the cluster's workers, their binaries brought back here, where every
        candidate is checked and timed, alone (compiles here pause while a candidate is timed)."""
        return search_module.search(self, budget, objective, actions, beam, depth, seed, cluster, recipes, places)

    def undo(self) -> Step:
        """Go back to the state before the last successful step; returns the step now current."""
        if len(self._states) == 1:
            raise DcnbError("nothing to undo: the session is at its naive step")
        undone = self._states.pop()
        self._history = self._history[: undone.step.index]
        return self.current

    def reset(self) -> Step:
        """Go back to the naive step, forgetting every later step."""
        del self._states[1:]
        self._history = self._history[:1]
        return self.current

    # --- text -----------------------------------------------------------------------------------------------------

    @property
    def title(self) -> str:
        """The module, its inputs' shapes and the device: ``Mish (8x32x64x64) on cpu``."""
        shapes = ", ".join("x".join(str(d) for d in t.shape) for t in self._inputs)
        return f"{self.name} ({shapes}) on {self.device}"

    def as_text(self) -> str:
        return "\n".join([f"dcnb session: {self.title}", *history_table(self._history)])

    def __repr__(self) -> str:
        return self.as_text()

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(self.as_text())

    # --- internals ------------------------------------------------------------------------------------------------

    def _progress(self, message: str) -> None:
        self._phase = message
        self._report(message)

    def _advance(self, state: _State, applied: Entry, index: int) -> _State:
        with builder.compiling() as compiles:
            return self._end(self._begin(state, applied, index, compiles))

    def _begin(self, state: _State, applied: Entry, index: int, compiles: builder.Compiles) -> _Begun:
        """``applied`` applied to a copy of ``state``'s SDFGs, their compiles started in ``compiles``; ``_end``
        waits for them, checks and times (a search begins the next candidate in between)."""
        action = actions.get(applied.name)
        if action.before_autodiff:
            pre = copy.deepcopy(state.pre)
            count = _run(action, pre, applied, self.device)
            check(count, f"{applied.name} matches nothing in the forward SDFG")
            before = tuple(a for a in state.applied if actions.get(a.name).before_autodiff)
            after = tuple(a for a in state.applied if not actions.get(a.name).before_autodiff)
            return self._begin_from(pre, (*before, applied), compiles, index, count, replay=after)
        # each side is replaced by its transformed copy as it is made
        prog = dataclasses.replace(state.sdfgs)
        counts: dict[str, int] = {}

        def transformed() -> Iterator[dace.SDFG | None]:
            if prog.backward is not None:
                self._progress(f"applying {applied.name} to the backward, and to the forward alongside")
            yield from _alongside(prog, lambda s: _run(action, s, applied, self.device), applied.name, counts)
            why_not = _why_not(action, prog, applied)
            check(sum(counts.values()), f"{applied.name} matches nothing in the forward or backward SDFG{why_not}")

        building = self._start_build(prog, transformed(), applied.name, compiles)
        return _Begun(state.pre, prog, building, (*state.applied, applied), index, sum(counts.values()))

    def _make_state(
        self,
        pre: dace.SDFG,
        applied: tuple[Entry, ...],
        index: int = 0,
        count: int = 0,
        replay: tuple[Entry, ...] = (),
    ) -> _State:
        with builder.compiling() as compiles:
            return self._end(self._begin_from(pre, applied, compiles, index, count, replay))

    def _begin_from(
        self,
        pre: dace.SDFG,
        applied: tuple[Entry, ...],
        compiles: builder.Compiles,
        index: int = 0,
        count: int = 0,
        replay: tuple[Entry, ...] = (),
    ) -> _Begun:
        """The state for a forward SDFG before autodiff, begun: differentiated, then the after-autodiff steps of
        ``replay`` applied again; each that no longer matches is left out of the recipe, and the step says so."""
        self._progress("generating the backward pass by autodiff" if self.backward else "preparing the forward pass")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            prog = program.differentiate(pre, self._imported, self._wrt() if self.backward else [])
        counts: dict[str, list[int]] = {}  # "forward", "backward" -> each entry of replay's count there

        def replayed(sdfg: dace.SDFG) -> list[int]:
            return [_run(actions.get(e.name), sdfg, e, self.device, strict=False) for e in replay]

        def sides() -> Iterator[dace.SDFG | None]:
            names = ", ".join(e.name for e in replay)
            if prog.backward is not None:
                self._progress(f"applying {names} again to the backward, and to the forward alongside")
            yield from _alongside(prog, replayed, f"{names} applied again", counts, own=True)

        # the step's own entry: a recipe replayed from the naive step has none before autodiff, and ends in replay's
        name = _last(applied or replay).name
        building = self._start_build(prog, sides() if replay else _build_order(prog), name, compiles)
        matched = [sum(c) for c in zip(*counts.values())] if replay else []
        kept = tuple(e for e, n in zip(replay, matched) if n)
        notes = tuple(
            f"{e.name}, applied after autodiff before, matches nothing now; left out of the recipe"
            for e, n in zip(replay, matched)
            if not n
        )
        applied = (*applied[:-1], *kept, *applied[-1:])
        return _Begun(pre, prog, building, applied, index, count, notes)

    def _start_build(
        self, prog: Program, sides: Iterable[dace.SDFG | None], name: str, compiles: builder.Compiles
    ) -> _Building:
        """Start the compile of each side of ``prog`` as ``sides`` gives it (in ``_build_order``); each starts at
        once, while the next side is made. Progress says what each side's build is doing (build.STAGES): a step's
        longest phase."""
        made = []
        stages: dict[str, str] = {}  # "backward", "forward" -> its stage (build.STAGES), in build order

        def announced() -> Iterator[dace.SDFG | None]:
            for side in sides:
                if side is not None:
                    made.append(side)
                    # before the build forks it: an interrupt right after the fork is then a cancel while compiling
                    self._phase = "compiling"
                yield side

        def report(side: dace.SDFG, stage: str) -> None:
            which = "backward" if side is prog.backward else "forward"
            if stage:
                stages[which] = stage
            else:
                stages.pop(which, None)
            if stages:
                self._report(_building(stages))

        building = _Building(name, made)
        with building.validated():
            building.started = builder.start(announced(), self.device, compiles, self._cuda_arch, report)
        return building

    def _end(self, begun: _Begun) -> _State:
        """``_begin``'s build waited for, checked against PyTorch and timed."""
        with begun.building.validated():
            built = begun.building.started.finish()
        if self.device == "cpu" and not native.ready():
            self._progress("building dcnb's C++ call path (once per machine and PyTorch version)")
        return self._finish(begun.pre, begun.prog, built, begun.applied, begun.index, begun.count, begun.notes)

    def _finish(
        self,
        pre: dace.SDFG,
        prog: Program,
        built: builder.Built,
        applied: tuple[Entry, ...],
        index: int,
        count: int,
        notes: tuple[str, ...] = (),
    ) -> _State:
        last = _last(applied)
        name = last.name
        (backward, forward), (backward_sdfg, forward_sdfg) = built.binaries, built.sdfgs
        signature = self._signature()
        again = Again(self._module, self._call, self._imported, signature)
        runner = Runner(self._imported, prog, forward, backward, self.device, again)
        candidate = self._dcnb_module(runner)
        self._progress("checking against PyTorch")
        result = self._reference.check(candidate)
        if not result.ok:
            raise StepError(f"{name} breaks correctness: {result.message}")
        timings, timing_notes = {}, ()
        if self._timed:
            self._progress("timing")
            with alone.timing():  # no background CUDA build competes for the cores
                timings, timing_notes = self._baselines.time(candidate)
        step = Step(
            index=index,
            name=name,
            options=last.options,
            where=last.where,
            ok=True,
            applied=count,
            check=result,
            intermediate_bytes=prog.stored_bytes(self._imported) if prog.backward is not None else 0,
            compile_seconds=built.seconds,
            timings=timings,
            counts={"forward": program.counts(forward_sdfg), "backward": program.counts(backward_sdfg)},
            notes=notes + timing_notes,
            # forked only now: the build made above and the timing do not share the cores with it
            cuda=None if self._cuda_builds is None else self._cuda_builds.start(self._for_cuda(pre, prog, applied)),
        )
        variants = {signature: self._variant(runner)}
        return _State(pre, prog, (forward_sdfg, backward_sdfg), runner, applied, step, Analysis(index), variants)

    def _for_cuda(self, pre: dace.SDFG, prog: Program, applied: tuple[Entry, ...]) -> cuda_check.Sides:
        """What a step's CUDA build builds: the step's SDFGs, or where an action of its recipe makes something for
        the device it runs for (auto_optimize: the CPU's BLAS calls, expanded) or is for the CPU only
        (vectorization: CPU vector types), the SDFGs the recipe makes on a GPU, made in the build's process:
        autodiff again, then the actions after it, for CUDA, those offered there."""
        after = [a for a in applied if not actions.get(a.name).before_autodiff]
        if not any(actions.get(a.name).for_device or "cuda" not in actions.get(a.name).devices for a in after):
            return [prog.forward, prog.backward]
        entries = [a for a in after if "cuda" in actions.get(a.name).devices]

        def made() -> list[dace.SDFG | None]:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                again = program.differentiate(pre, self._imported, self._wrt() if self.backward else [])
                for entry in entries:
                    for side in _sides(again):
                        _run(actions.get(entry.name), side, entry, "cuda", strict=False)
            return [again.forward, again.backward]

        return made

    def _wrt(self) -> list[str]:
        imp = self._imported
        floating = {n for n, t in zip(imp.all_inputs, self._inputs) if t.is_floating_point()}
        wanted = [n for n in imp.inputs if n in floating]
        params = dict(self._module.named_parameters())
        wanted += [n for n, path in imp.param_paths.items() if path in params and params[path].requires_grad]
        return wanted

    def _signature(self) -> Signature:
        """The example call's signature, in the session's mode."""
        return Signature.of(self._inputs, first_floating(self._module), self.training)

    def _variant(self, runner: Runner) -> Variant:
        return Variant(runner, [t.shape for t in self._reference.outputs], self._result)

    def _dcnb_module(self, runner: Runner) -> DcnbModule:
        """A module running ``runner`` (a step's candidate) for the example's signature only."""
        return DcnbModule(self._module, OneBuild(self._call, self._signature(), self._variant(runner)), self.training)


@dataclasses.dataclass
class _Building:
    """A step's build under way: what it was started for and the SDFGs given so far. The SDFGs are validated only
    where the build fails: DaCe validates each again before it generates its code, in the compile's own process
    (validating a ResNet-18's backward first held its compile back 1.2 s)."""

    name: str
    made: list[dace.SDFG]
    started: builder.Started | None = None

    @contextlib.contextmanager
    def validated(self) -> Iterator[None]:
        try:
            yield
        except Exception as e:
            for side in self.made:
                try:
                    side.validate()
                except Exception as invalid:
                    raise StepError(f"{self.name} left an invalid SDFG: {describe(invalid)}") from e
            raise


@dataclasses.dataclass
class _Begun:
    """A step begun (``Session._begin``): its SDFGs made, their compiles under way."""

    pre: dace.SDFG
    prog: Program
    building: _Building
    applied: tuple[Entry, ...]
    index: int
    count: int
    notes: tuple[str, ...] = ()


@contextlib.contextmanager
def _timed_alone(module: nn.Module, training: bool) -> Iterator[None]:
    with verify.preserved(module, training), alone.timing():
        yield


class _Builds:
    """Session.module's builds (module.Builds): the session's current step's."""

    def __init__(self, session: Session):
        self.call = session._call
        self._session = session

    def token(self) -> object:
        return self._session._states[-1]

    def variant(self, module: nn.Module, signature: Signature, tensors: list[torch.Tensor]) -> Variant:
        return self._session._variant_for(signature, tensors)

    def portable(self) -> Rebuild:
        return self._session._portable()


@dataclasses.dataclass
class Rebuild:
    """What a copy or a pickle of a compiled module carries in place of its session (module.Builds): the example
    call and the recipe. The session is built again on the first call, straight at the recipe, for the copy's own
    module; the build cache finds the binaries by their content where they were built before."""

    call: Call
    inputs: list[torch.Tensor]
    kwargs: dict[str, Any]
    recipe: tuple[Entry, ...]
    backward: bool
    training: bool
    device: str
    _session: Session | None = dataclasses.field(default=None, repr=False, compare=False)

    def token(self) -> object:
        return None if self._session is None else self._session._states[-1]

    def variant(self, module: nn.Module, signature: Signature, tensors: list[torch.Tensor]) -> Variant:
        if self._session is None:
            self._session = Session._built_at(
                module,
                self.inputs,
                self.kwargs,
                self.recipe,
                backward=self.backward,
                training=self.training,
                device=self.device,
            )
        return self._session._variant_for(signature, tensors)

    def portable(self) -> Rebuild:
        return self  # its session stays behind in a pickle (__getstate__)

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_session": None}


def _signatures(state: _State) -> str:
    return "; ".join(str(s) for s in state.variants)


def _last(applied: tuple[Entry, ...]) -> Entry:
    """The step's own entry: the last applied, the naive step's where none is."""
    return applied[-1] if applied else Entry("naive")


#: what a build is doing to sides at one of its stages (build.STAGES)
_BUILDING = {
    builder.PREPARING: "preparing {} for the compiler",
    builder.STARTING: "starting the compile of {}",
    builder.WAITING: "waiting for the build folder of {}",
    builder.GENERATING: "generating code for {}",
    builder.HEADER: "building DaCe's precompiled header for {}",
    builder.COMPILING: "compiling {}",
    builder.ON_WORKER: "compiling {} on a worker of the cluster",
}


def _building(stages: dict[str, str]) -> str:
    """What a build is doing now, from each side's stage: ``compiling the backward pass; generating code for the
    forward pass``, ``compiling the backward and forward passes``."""
    at: dict[str, list[str]] = {}
    for side, stage in stages.items():
        at.setdefault(stage, []).append(side)
    named = {stage: f"the {s[0]} pass" if len(s) == 1 else f"the {' and '.join(s)} passes" for stage, s in at.items()}
    return "; ".join(_BUILDING[stage].format(sides) for stage, sides in named.items())


def _build_order(prog: Program) -> tuple[dace.SDFG | None, dace.SDFG]:
    """The backward (None where there is none), then the forward: the backward's compile is the longer, and starts
    first."""
    return prog.backward, prog.forward


def _sides(prog: Program) -> list[dace.SDFG]:
    """The forward SDFG, and the backward where there is one."""
    return [s for s in (prog.forward, prog.backward) if s is not None]


def _targets(action: actions.Action, state: _State) -> list[dace.SDFG]:
    """The SDFGs ``action`` transforms in ``state``: the forward before autodiff, else its sides."""
    return [state.pre] if action.before_autodiff else _sides(state.sdfgs)


def _run(action: actions.Action, sdfg: dace.SDFG, applied: Entry, device: str, strict: bool = True) -> int:
    action.check_options(applied.options)
    # the library nodes of identical layers expand once (auto_optimize's 1,867 on a 12-layer BERT's backward: its
    # ONNX ops, then their products and reductions), as in the code generation
    with warnings.catch_warnings(), dace_internals.expansions_reused():
        warnings.simplefilter("ignore")
        if not strict and action.count(sdfg, applied.where, applied.options) == 0:
            return 0
        return action.run(sdfg, applied.where, applied.options, device)


def _alongside(
    prog: Program, work: Callable[[dace.SDFG], Any], what: str, done: dict[str, Any], own: bool = False
) -> Iterator[dace.SDFG | None]:
    """``work`` done on each side of ``prog``, each side yielded as it is done, in the build order
    (``_build_order``), so that its compile starts: the backward here and the forward meanwhile in a forked process
    of its own, on the fork's copy, which comes back pickled (on a 12-layer transformer each side's transformation
    takes a minute, and there are two cores). ``done`` gets ``work``'s result per side. The sides are replaced by
    copies first unless they are ``prog``'s ``own`` (not a kept state's too)."""
    if prog.backward is None:
        prog.forward = prog.forward if own else copy.deepcopy(prog.forward)
        done["forward"] = work(prog.forward)
        yield from (None, prog.forward)
        return
    with forked.interrupts_deferred():  # an interrupt between the fork and the try would leave it
        forward = forked.Child(_worked, work, prog.forward)
    try:
        prog.backward = prog.backward if own else copy.deepcopy(prog.backward)
        done["backward"] = work(prog.backward)
        yield prog.backward  # compiled while the forward is finished
        try:
            prog.forward, done["forward"] = forward.waited()
        except forked.Lost as e:
            raise StepError(f"{what} on the forward: its process {e}") from None
    finally:
        forward.stop()
    yield prog.forward


def _worked(work: Callable[[dace.SDFG], Any], sdfg: dace.SDFG) -> tuple[dace.SDFG, Any]:
    """In a forked process (``forked.Child``): its copy of ``sdfg`` after ``work``, and what ``work`` returned."""
    return sdfg, work(sdfg)


def _why_not(action: actions.Action, prog: Program, applied: Entry) -> str:
    if action.why_not is None:
        return ""
    reasons = [r for s in _sides(prog) for r in action.why_not(s, applied.where, applied.options)]
    return f" ({'; '.join(reasons)})" if reasons else ""


def _safe_count(action: actions.Action, sdfg: dace.SDFG, where, options) -> int:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return action.count(sdfg, where, options)
    except Exception:  # a matcher that crashes offers nothing rather than breaking the menu
        return 0


def _safe_places(action: actions.Action, sdfg: dace.SDFG, where, options) -> list[actions.Bound]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return action.places(sdfg, where, options)
    except Exception:  # as for counts
        return []


def optimize(
    module: nn.Module,
    *example_inputs: torch.Tensor,
    kwargs: Mapping[str, Any] | None = None,
    backward: bool = True,
    training: bool = False,
    device: str = "auto",
    cuda_build: bool | None = None,
    cuda_arch: str | None = None,
    **options: Any,
) -> Session:
    """Export ``module``, build its forward (and backward) SDFGs with DaCe, compile, check and time: step 0.

    ``kwargs`` are keyword inputs of the example call (tensors such as an attention mask; other values, such as
    flags, are compiled in). On the CPU, where nvcc is present, every step also builds for CUDA in the background
    (``Step.cuda``; ``cuda_build=False`` or ``DCNB_CUDA_BUILD=0`` turn that off) for ``cuda_arch`` ("sm_80",
    "sm_86", "sm_89" or "sm_90"; default: the GPU's own, else sm_90); on a GPU it is the architecture the steps
    build for. ``options`` go to Session: ``baselines`` (default ("torch", "torch_compile")), ``time_budget``
    (seconds of timing per step), ``progress`` (a callable receiving one-line progress messages).
    """
    return Session(
        module,
        example_inputs,
        kwargs=kwargs,
        backward=backward,
        training=training,
        device=device,
        cuda_build=cuda_build,
        cuda_arch=cuda_arch,
        **options,
    )


def replay(
    module: nn.Module,
    *example_inputs: torch.Tensor,
    recipe: Sequence[dict[str, Any]],
    kwargs: Mapping[str, Any] | None = None,
    backward: bool = True,
    training: bool = False,
    device: str = "auto",
    cuda_build: bool | None = None,
    cuda_arch: str | None = None,
    **options: Any,
) -> Session:
    """Rebuild a session non-interactively from ``Session.recipe``; raises DcnbError if a step fails. The options
    are ``optimize``'s."""
    entries = parse_recipe(recipe)
    session = optimize(
        module,
        *example_inputs,
        kwargs=kwargs,
        backward=backward,
        training=training,
        device=device,
        cuda_build=cuda_build,
        cuda_arch=cuda_arch,
        **options,
    )
    replay_recipe(session, entries)
    return session
