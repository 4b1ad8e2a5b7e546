"""A recipe: the steps that built a session's state, as data that replays them (``Session.recipe``, Export recipe,
``%%dcoptimize --recipe``, ``dcnb.replay``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from .errors import DcnbError
from .names import readable_label

if TYPE_CHECKING:
    from .session import Session


@dataclasses.dataclass(frozen=True)
class Entry:
    """One step as a recipe stores it: the action's name, its options and the nodes it was restricted to."""

    name: str
    options: dict[str, Any] = dataclasses.field(default_factory=dict)
    where: tuple[str, ...] | None = None

    @property
    def title(self) -> str:
        """The action, where it was applied (by the names the graphs draw: DaCe's stay in ``where`` and the recipe)
        and its options: how the history and a search's table name a step."""
        text = self.name
        if self.where:
            text += f" (where {', '.join(readable_label(label) for label in self.where)})"
        if self.options:
            text += " " + " ".join(f"{k}={v!r}" for k, v in self.options.items())
        return text

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"name": self.name}
        if self.options:
            entry["options"] = dict(self.options)
        if self.where is not None:
            entry["where"] = list(self.where)
        return entry

    @classmethod
    def from_json(cls, data: object, index: int = 0) -> Entry:
        """The entry ``data`` (as ``to_json`` writes it); a DcnbError names what is wrong with entry ``index``."""
        if not isinstance(data, dict) or not isinstance(data.get("name"), str):
            raise DcnbError(f'recipe entry {index} is not a step (a dict with a "name", e.g. {{"name": "map_fusion"}}): {data!r}')
        unknown = set(data) - {"name", "options", "where"}
        if unknown:
            raise DcnbError(f"recipe entry {index} ({data['name']}) has unknown keys: {', '.join(sorted(unknown))}")
        options, where = data.get("options", {}), data.get("where")
        if not isinstance(options, dict):
            raise DcnbError(f"recipe entry {index} ({data['name']}): options must be a dict, not {options!r}")
        if where is not None and (not isinstance(where, list) or not all(isinstance(w, str) for w in where)):
            raise DcnbError(f"recipe entry {index} ({data['name']}): where must be a list of node labels, not {where!r}")
        return cls(data["name"], dict(options), None if where is None else tuple(where))


def parse(data: object) -> list[Entry]:
    """A recipe from JSON data (a list of entries); a DcnbError names the first entry that is not one."""
    if not isinstance(data, list):
        raise DcnbError(f'a recipe is a list of steps like {{"name": "map_fusion"}}, not a {type(data).__name__}')
    return [Entry.from_json(item, i) for i, item in enumerate(data)]


def replay(
    session: Session, recipe: Sequence[Entry], announce: Callable[[int, Entry], None] | None = None
) -> None:
    """Apply each entry of ``recipe`` to ``session`` in order (``announce(i, entry)`` before each); a DcnbError
    names the first step that fails, and the session stays at the step before it."""
    for i, entry in enumerate(recipe):
        if announce is not None:
            announce(i, entry)
        try:
            step = session.apply(entry.name, where=entry.where, **entry.options)
        except KeyError as e:  # an action this version of dcnb does not have
            raise DcnbError(f"replaying the recipe stopped at step {i + 1}: {e.args[0]}") from None
        if not step.ok:
            raise DcnbError(f"replaying the recipe stopped at step {i + 1} ({entry.name}): {step.error}")
