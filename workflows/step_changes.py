"""Which of a run's steps changed since each reader last looked, and whether what a live view shows changed."""

from __future__ import annotations

from collections.abc import Callable, Hashable

from workflows.contract import StepState

__all__ = ["IN_PLAY", "StatusWatch", "StepChanges", "StepsInPlay"]


class StepChanges:
    """Tells each reader which steps changed: every step reports each change of its own (StepState.on_change),
    so a reader's work is the steps that changed, never all of them. The run's steps must be final."""

    def __init__(self, steps: dict[str, StepState]) -> None:
        self.steps = steps
        self.position = {step_id: position for position, step_id in enumerate(steps)}
        self._readers: list[set[str]] = []
        for step in steps.values():
            step.on_change(self._changed)

    def reader(self) -> set[str]:
        """The ids of the steps changed since the reader last emptied this set; every step at first."""
        changed = set(self.steps)
        self._readers.append(changed)
        return changed

    def taken(self, changed: set[str]) -> list[tuple[int, StepState]]:
        """A reader's changed steps, (position, step) by position, its set emptied."""
        steps = sorted(((self.position[step_id], self.steps[step_id]) for step_id in changed), key=_first)
        changed.clear()
        return steps

    def _changed(self, step_id: str) -> None:
        for changed in self._readers:
            changed.add(step_id)


def _first(item: tuple[int, StepState]) -> int:
    return item[0]


class _Mark:
    """What since() compares against: the run's part then, and each step's part then for the steps changed since."""

    def __init__(self, run: Hashable) -> None:
        self.run = run
        self.then: dict[str, Hashable] = {}
        self.moved: set[str] = set()
        self.done = False

    def step_moved(self, step_id: str, old: Hashable, new: Hashable) -> None:
        then = self.then.setdefault(step_id, old)
        if new == then:
            self.moved.discard(step_id)
        else:
            self.moved.add(step_id)


class StatusWatch:
    """Whether a run's signature (the run's part and every step's part) differs from what it was at a mark.

    A step's part is re-read only when the step reported a change; a mark keeps, for the steps whose part
    moved since, their part at the mark, so a change undone before anyone looked is no change, as when the
    whole signature is compared. The run's part is read whole each time (a few fields).
    """

    def __init__(self, changes: StepChanges, step_part: Callable[[StepState], Hashable],
                 run_part: Callable[[], Hashable]) -> None:
        self._steps = changes.steps
        self._changed = changes.reader()
        self._step_part = step_part
        self._run_part = run_part
        self._parts = {step_id: step_part(step) for step_id, step in self._steps.items()}
        self._changed.clear()
        self._marks: list[_Mark] = []

    def since(self) -> Callable[[], bool]:
        """A condition for workflow.wait_condition: true once the signature differs from what it is now."""
        self._refresh()
        mark = _Mark(self._run_part())
        self._marks.append(mark)

        def changed() -> bool:
            if mark.done:
                return True
            self._refresh()
            if mark.moved or self._run_part() != mark.run:
                mark.done = True
                self._marks.remove(mark)
            return mark.done

        return changed

    def _refresh(self) -> None:
        for step_id in self._changed:
            new = self._step_part(self._steps[step_id])
            old = self._parts[step_id]
            if new != old:
                self._parts[step_id] = new
                for mark in self._marks:
                    mark.step_moved(step_id, old, new)
        self._changed.clear()


# The statuses that make a step the run's current one (the last such, by position), in status() and here.
IN_PLAY = ("running", "awaiting_approval", "held")


class StepsInPlay:
    """The run's current step and held steps, as status() finds them, kept from the changed steps alone."""

    def __init__(self) -> None:
        self._playing: dict[str, int] = {}
        self._held: dict[str, int] = {}

    def update(self, steps: list[tuple[int, StepState]]) -> tuple[str | None, list[str]]:
        """Take the changed steps; the current step (the last in play, by position) and the held ones, by position."""
        for position, step in steps:
            for kept, statuses in ((self._playing, IN_PLAY), (self._held, ("held",))):
                if step.status in statuses:
                    kept[step.id] = position
                else:
                    kept.pop(step.id, None)
        current = max(self._playing, key=self._playing.__getitem__) if self._playing else None
        return current, sorted(self._held, key=self._held.__getitem__)
