"""The hardened bubblewrap command line and the start-up probe, shared by every sandbox.

Why one place: each environment that runs untrusted code (the code REPL and `/verify`, workspaces)
must get the same guarantees, and a flag forgotten in one copy is an escape. What it promises:

- never root outside: bwrap is never started as uid 0 (`unprivileged()` drops root to
  `SANDBOX_UID` before exec'ing it; cgroup set-up happens before the drop), so the user namespace
  maps the sandbox user onto an unprivileged uid. No `--dev` (it makes bwrap nest a second user
  namespace in which `/proc/self/uid_map` reads as uid 0); /dev is built from single device binds;
- `/proc/sys` and `/proc/sysrq-trigger` read-only, `/dev` read-only except a sized `/dev/shm`;
- every writable place is a size-capped tmpfs: /tmp (the work dir) and /dev/shm share `tmp_mb`,
  and tmpfs pages are charged to the sandbox's memory cgroup where there is one;
- a fresh read-only root with only /usr, the interpreter and the `binds` given, no network,
  a clean environment, no nested user namespaces.

`PROBE` is a program to run inside such a sandbox at start-up, `host_uids()` reads a running
sandbox's uids from outside; `probe_problems()` lists from both why the server must refuse to serve
(the sandbox user is uid 0 outside, a global sysctl opens for writing). The probe opens files with
O_WRONLY and closes them unwritten.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

SANDBOX_UID = 65534
INSIDE_PATH = "/usr/local/bin:/usr/bin:/bin"
SITE_DIR = "/opt/gymserve/site"
# importable inside the sandbox: bound read-only from this interpreter's environment (the versions
# pinned by the project's install), one directory per package, nothing else of site-packages
SANDBOX_PACKAGES = ("numpy", "sympy", "mpmath")
_DEVICES = ("null", "zero", "full", "random", "urandom")


@dataclasses.dataclass(frozen=True)
class Bind:
    """`src` (outside) visible at `dest` (inside); read-only unless `writable`."""

    src: str
    dest: str
    writable: bool = False


def shm_mb(tmp_mb: int) -> int:
    """The part of the `tmp_mb` budget that /dev/shm gets (the rest is /tmp)."""
    return max(1, tmp_mb // 8)


def bwrap_argv(bwrap: str, *, tmp_mb: int, binds: Sequence[Bind] = (), env: Mapping[str, str] | None = None,
               proc: bool = True, disable_userns: bool = True, seccomp_fd: int | None = None,
               status_fd: int | None = None, chdir: str = "/tmp", hostname: str = "sandbox",
               as_pid_1: bool = False) -> list[str]:
    """The bwrap argv (without the command) for a sandbox with these binds and a `tmp_mb` writable budget.

    `env` replaces the whole environment (default PATH, HOME=/tmp, LANG). `proc=False` mounts no
    /proc (container runtimes that mask /proc paths forbid a fresh one); then only a seccomp filter
    keeps nested namespaces out, so pass `disable_userns=False` only together with `seccomp_fd`.
    Start the result through `unprivileged()` when this process may be root. `as_pid_1`: the command
    is the pid namespace's init itself (it must reap), so what it starts cannot signal it.
    """
    env = dict(env) if env is not None else {"PATH": INSIDE_PATH, "HOME": "/tmp", "LANG": "C.UTF-8"}
    shm = shm_mb(tmp_mb)
    args = [bwrap, "--unshare-all", "--unshare-user", *(["--disable-userns"] if disable_userns else []),
            *(["--as-pid-1"] if as_pid_1 else []), "--die-with-parent", "--new-session", "--clearenv"]
    for key, value in env.items():
        args += ["--setenv", key, value]
    args += ["--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", hostname, "--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            args += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            args += ["--ro-bind", top, top]
    if os.path.exists("/etc/ld.so.cache"):
        args += ["--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache"]
    for bind in binds:
        args += ["--bind" if bind.writable else "--ro-bind", bind.src, bind.dest]
    if proc:
        # bwrap covers /proc/sys only when it does not create the user namespace itself: do it always
        args += ["--proc", "/proc", "--ro-bind", "/proc/sys", "/proc/sys",
                 "--ro-bind-try", "/proc/sysrq-trigger", "/proc/sysrq-trigger"]
    else:
        args += ["--dir", "/proc"]
    args += ["--size", str(shm << 20), "--tmpfs", "/dev"]
    for name in _DEVICES:
        args += ["--dev-bind", f"/dev/{name}", f"/dev/{name}"]
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                         ("stderr", "/proc/self/fd/2")):
        args += ["--symlink", target, f"/dev/{name}"]
    args += ["--size", str(shm << 20), "--tmpfs", "/dev/shm", "--remount-ro", "/dev",
             "--size", str(max(1, tmp_mb - shm) << 20), "--tmpfs", "/tmp", "--chdir", chdir]
    if status_fd is not None:
        args += ["--json-status-fd", str(status_fd)]
    if seccomp_fd is not None:
        args += ["--seccomp", str(seccomp_fd)]
    return [*args, "--remount-ro", "/"]


_DROP = ("import os, sys; uid = int(sys.argv[1]); os.setgroups([]); os.setgid(uid); os.setuid(uid); "
         "os.execv(sys.argv[2], sys.argv[2:])")


def unprivileged(argv: list[str], uid: int = SANDBOX_UID) -> list[str]:
    """`argv` run as `uid` (groups cleared) when this process is root, unchanged otherwise.

    A tiny launcher drops root and execs: not `create_subprocess_exec(user=...)` (uvloop rejects
    it) nor a `preexec_fn` (unsafe with threads). Put cgroup joins before it in the chain.
    """
    if os.geteuid() != 0:
        return argv
    return [os.path.realpath(sys.executable), "-I", "-S", "-c", _DROP, str(uid), *argv]


def spawn_uid() -> int:
    """The uid bwrap runs as when started through `unprivileged()`: what the sandbox maps onto."""
    return SANDBOX_UID if os.geteuid() == 0 else os.geteuid()


def reachable_by(path: str, uid: int) -> bool:
    """Whether `uid` (not root) can reach `path`: every directory above it searchable by others or
    owned by `uid`, and `path` itself readable the same way."""
    parts = Path(path).parts
    for i in range(1, len(parts) + 1):
        try:
            st = os.stat(os.path.join(*parts[:i]))
        except OSError:
            return False
        bits = 0o700 if st.st_uid == uid else 0o007
        need = 0o111 if i < len(parts) else 0o444
        if not st.st_mode & bits & need:
            return False
    return True


def package_binds(names: Iterable[str] = SANDBOX_PACKAGES, uid: int | None = None) -> list[Bind]:
    """Read-only binds under SITE_DIR of these installed packages (and their bundled `.libs`)."""
    binds: list[Bind] = []
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        pkg = os.path.realpath(list(spec.submodule_search_locations)[0])
        for src in (pkg, pkg + ".libs"):
            if os.path.isdir(src) and (uid is None or reachable_by(src, uid)):
                binds.append(Bind(src, f"{SITE_DIR}/{os.path.basename(src)}"))
    return binds


# Run inside the sandbox; prints one JSON report. Opens with O_WRONLY and closes unwritten.
PROBE = r'''
import json, os
report = {"uid": os.getuid(), "uid_map": None, "writable": []}
try:
    with open("/proc/self/uid_map") as f:
        report["uid_map"] = f.read()
except OSError:
    pass
def _try(path):
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError:
        return
    os.close(fd)
    report["writable"].append(path)
_try("/proc/sysrq-trigger")
for root, dirs, files in os.walk("/proc/sys"):
    for name in files:
        _try(os.path.join(root, name))
    if len(report["writable"]) > 20:
        break
print("gymserve-probe " + json.dumps(report))
'''


def parse_probe(stdout: str) -> dict[str, Any] | None:
    """The report PROBE printed, or None."""
    for line in stdout.splitlines():
        if line.startswith("gymserve-probe "):
            try:
                report = json.loads(line.split(" ", 1)[1])
            except ValueError:
                return None
            return report if isinstance(report, dict) else None
    return None


def host_uids(pid: int) -> dict[int, int]:
    """The real uid of `pid` and of each of its descendants, as this process (outside) sees them.

    Why from outside: inside, /proc/self/uid_map is relative to the parent namespace, and bwrap may
    nest one (as root with --disable-userns it reads `65534 65534 1` while the code runs as host
    root); /proc/<pid>/status translates uids into the reader's namespace."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    parents[int(entry)] = int(f.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
    family, changed = {pid}, True
    while changed:
        found = {child for child, parent in parents.items() if parent in family}
        changed = not found <= family
        family |= found
    uids: dict[int, int] = {}
    for member in family:
        try:
            with open(f"/proc/{member}/status") as f:
                uids[member] = next(int(line.split()[1]) for line in f if line.startswith("Uid:"))
        except (OSError, StopIteration, ValueError):
            continue
    return uids


def probe_problems(report: dict[str, Any] | None, started_as: int, outside: Mapping[int, int] | None = None) -> list[str]:
    """Why a sandbox must not be used, from PROBE's report, the uid bwrap was started as and, when
    given, `host_uids()` of a running sandbox."""
    if report is None:
        return ["the sandbox probe printed no report"]
    problems = []
    if started_as == 0:
        problems.append("bwrap would be started as root, so the sandbox user would be root outside")
    rooted = sorted(pid for pid, uid in (outside or {}).items() if uid == 0)
    if rooted:
        problems.append(f"sandbox processes run as uid 0 outside (pids {rooted[:5]})")
    for line in (report.get("uid_map") or "").splitlines():
        fields = line.split()
        if len(fields) == 3 and fields[1] == "0":
            problems.append(f"the sandbox user maps onto uid 0 outside (/proc/self/uid_map: {line.strip()!r})")
    if report.get("writable"):
        shown = ", ".join(report["writable"][:5])
        problems.append(f"global kernel settings open for writing inside the sandbox: {shown}")
    return problems
