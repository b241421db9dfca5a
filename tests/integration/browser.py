"""Debian's Chromium, headless, for tests that look at a page the way a user's browser does.

Chromium's own `--dump-dom` and `--screenshot` with `--virtual-time-budget` are enough for
"load the page, let its scripts run, then read the DOM / take a picture": no WebDriver,
no extra Python package, and the browser is the one users get from apt. Virtual time
pauses while fetches are pending, so the page's polling settles deterministically.
"""
from __future__ import annotations

import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest

FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-sync", "--hide-scrollbars",
         "--disable-extensions", "--disable-default-apps", "--mute-audio")


def chromium_binary() -> str:
    """Path to `chromium`, installing Debian's package first when it is missing (needs root)."""
    found = shutil.which("chromium")
    if found:
        return found
    if os.geteuid() != 0:
        pytest.fail("Debian's chromium is not installed and this test is not root: apt-get install chromium")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    subprocess.run(["apt-get", "update", "-qq"], env=env, check=False, timeout=600, capture_output=True)
    done = subprocess.run(["apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium"], env=env,
                          timeout=900, capture_output=True, text=True)
    found = shutil.which("chromium")
    if not found:
        pytest.fail(f"could not install chromium with apt-get:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return found


class Chromium:
    """Runs the browser on a fresh profile under `home` (HOME too, so nothing lands elsewhere)."""

    def __init__(self, binary: str, home: Path, *, window: str = "1400,2000", timeout_s: float = 180.0) -> None:
        self.binary = binary
        self.home = home
        self.window = window
        self.timeout_s = timeout_s
        home.mkdir(parents=True, exist_ok=True)

    def _run(self, url: str, *extra: str, budget_ms: int) -> subprocess.CompletedProcess[str]:
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.home),
               "XDG_CONFIG_HOME": str(self.home / "config"), "XDG_CACHE_HOME": str(self.home / "cache"),
               "TMPDIR": str(self.home), "LANG": "C.UTF-8", "TZ": "UTC"}
        cmd = [self.binary, *FLAGS, f"--user-data-dir={self.home / 'profile'}", f"--window-size={self.window}",
               f"--virtual-time-budget={budget_ms}", *extra, url]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=self.timeout_s, env=env)
        if done.returncode != 0:
            raise AssertionError(f"chromium exited {done.returncode}: {done.stderr[-3000:]}")
        return done

    def dump_dom(self, url: str, *, budget_ms: int = 4000) -> str:
        """The DOM after the page's scripts ran for `budget_ms` of virtual time."""
        return self._run(url, "--dump-dom", budget_ms=budget_ms).stdout

    def screenshot(self, url: str, path: Path, *, budget_ms: int = 4000) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
        self._run(url, f"--screenshot={path}", budget_ms=budget_ms)
        assert path.exists(), "chromium wrote no screenshot"
        return path

    def close(self) -> None:
        shutil.rmtree(self.home, ignore_errors=True)


class Element:
    def __init__(self, tag: str, attrs: dict[str, str], parent: "Element | None") -> None:
        self.tag, self.attrs, self.parent = tag, attrs, parent
        self.text = ""

    def closest(self, attr: str) -> "Element | None":
        node: Element | None = self
        while node is not None and attr not in node.attrs:
            node = node.parent
        return node


class DomIndex(HTMLParser):
    """Every element of a dumped DOM, with parents, for simple queries in asserts."""

    _VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[Element] = []
        self._stack: list[Element] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        el = Element(tag, {k: v or "" for k, v in attrs}, self._stack[-1] if self._stack else None)
        self.elements.append(el)
        if tag not in self._VOID:
            self._stack.append(el)

    def handle_endtag(self, tag: str) -> None:
        for i in range(len(self._stack) - 1, -1, -1):
            if self._stack[i].tag == tag:
                del self._stack[i:]
                return

    def handle_data(self, data: str) -> None:
        for el in self._stack:
            el.text += data

    def find(self, tag: str | None = None, **attrs: str) -> list[Element]:
        def match(el: Element) -> bool:
            return (tag is None or el.tag == tag) and all(
                el.attrs.get(k.replace("_", "-")) == v if v != "*" else k.replace("_", "-") in el.attrs
                for k, v in attrs.items())
        return [el for el in self.elements if match(el)]

    def by_id(self, ident: str) -> Element:
        found = [el for el in self.elements if el.attrs.get("id") == ident]
        assert found, f"no element #{ident}"
        return found[0]

    def within(self, ancestor: Element, tag: str | None = None, **attrs: str) -> list[Element]:
        out = []
        for el in self.find(tag, **attrs):
            node = el.parent
            while node is not None and node is not ancestor:
                node = node.parent
            if node is ancestor:
                out.append(el)
        return out
