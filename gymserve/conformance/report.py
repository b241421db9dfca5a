"""Named checks and their outcomes: each check passes, or fails with one line saying why."""
from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx


class CheckFailed(Exception):
    """A check's verdict (the message is what the user reads)."""


def expect(condition: object, message: str) -> None:
    if not condition:
        raise CheckFailed(message)


@dataclass
class Outcome:
    name: str
    ok: bool
    detail: str = ""
    seconds: float = 0.0


@dataclass
class Report:
    kind: str
    outcomes: list[Outcome] = field(default_factory=list)

    @contextlib.contextmanager
    def check(self, name: str) -> Iterator[None]:
        """Run one check; a CheckFailed, an assertion or an HTTP error fails it and the run goes on."""
        start = time.perf_counter()
        try:
            yield
        except (CheckFailed, AssertionError, httpx.HTTPError, ValueError, KeyError, TypeError) as exc:
            detail = str(exc) or type(exc).__name__
            if isinstance(exc, httpx.HTTPError):
                detail = f"{type(exc).__name__}: {exc}"
            self.outcomes.append(Outcome(name, False, detail.splitlines()[0][:300] if detail else "",
                                         time.perf_counter() - start))
        else:
            self.outcomes.append(Outcome(name, True, "", time.perf_counter() - start))

    def fail(self, name: str, detail: str) -> None:
        self.outcomes.append(Outcome(name, False, detail))

    @property
    def failed(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.ok]

    @property
    def ok(self) -> bool:
        return bool(self.outcomes) and not self.failed

    def render(self) -> str:
        lines = [f"gymserve check {self.kind}"]
        for o in self.outcomes:
            mark = "PASS" if o.ok else "FAIL"
            lines.append(f"  {mark}  {o.name}" + (f": {o.detail}" if o.detail else ""))
        if self.ok:
            lines.append(f"{len(self.outcomes)} checks passed")
        else:
            lines.append(f"{len(self.failed)} of {len(self.outcomes)} checks failed: "
                         + ", ".join(o.name for o in self.failed))
        return "\n".join(lines)
