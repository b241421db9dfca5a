"""A small seccomp-BPF filter for the sandbox, assembled here in pure Python.

Why hand-assembled: bubblewrap's `--seccomp FD` takes a compiled classic-BPF program,
and writing ~60 instructions needs no C library or extra package (libseccomp's Python
binding is not on PyPI as a wheel). The filter is defence in depth on top of the
namespaces: it refuses (EPERM) the syscalls a sandboxed program never needs and that
widen the kernel attack surface or reach other processes: ptrace and
process_vm_* and pidfd_getfd, non-Unix sockets, new namespaces (unshare/setns, clone with CLONE_NEW*),
mounts, kernel modules/keyring/bpf/perf/userfaultfd/io_uring. `clone3` answers
ENOSYS so the C library falls back to `clone`, whose flags a filter can inspect.
Foreign ABIs (i386 on x86_64, x32) are killed outright.
"""
from __future__ import annotations

import errno
import platform
import struct

# seccomp_data offsets and return actions (linux/seccomp.h)
_NR, _ARCH, _ARG0 = 0, 4, 16
RET_ALLOW = 0x7FFF0000
RET_KILL_PROCESS = 0x80000000
RET_ERRNO = 0x00050000

# classic BPF opcodes (linux/filter.h)
_LD_ABS = 0x20      # BPF_LD | BPF_W | BPF_ABS
_JEQ = 0x15         # BPF_JMP | BPF_JEQ | BPF_K
_JGE = 0x35         # BPF_JMP | BPF_JGE | BPF_K
_JSET = 0x45        # BPF_JMP | BPF_JSET | BPF_K
_RET = 0x06         # BPF_RET | BPF_K

AF_UNIX = 1
# CLONE_NEWNS|NEWCGROUP|NEWUTS|NEWIPC|NEWUSER|NEWPID|NEWNET|NEWTIME
CLONE_NEW_MASK = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x80
X32_BIT = 0x40000000

BLOCKED = (
    "ptrace", "process_vm_readv", "process_vm_writev", "kexec_load", "kexec_file_load", "mount", "umount2",
    "pivot_root", "chroot", "swapon", "swapoff", "reboot", "init_module", "finit_module", "delete_module", "acct",
    "bpf", "perf_event_open", "userfaultfd", "keyctl", "add_key", "request_key", "unshare", "setns",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "open_by_handle_at", "name_to_handle_at",
    "open_tree", "move_mount", "fsopen", "fsconfig", "fsmount", "fspick", "mount_setattr", "syslog",
    # another process's file descriptors (bwrap's own pid 1 holds the server's pipes, and is dumpable)
    "pidfd_getfd",
    # anonymous files no limit counts where there is no memory cgroup (unmapped, they escape RLIMIT_AS)
    "memfd_create",
)

# Syscall numbers per architecture (checked against libseccomp in tests/unit when it is installed).
_X86_64 = {
    "ptrace": 101, "process_vm_readv": 310, "process_vm_writev": 311, "kexec_load": 246, "kexec_file_load": 320,
    "mount": 165, "umount2": 166, "pivot_root": 155, "chroot": 161, "swapon": 167, "swapoff": 168,
    "reboot": 169, "init_module": 175, "finit_module": 313, "delete_module": 176, "acct": 163, "bpf": 321,
    "perf_event_open": 298, "userfaultfd": 323, "keyctl": 250, "add_key": 248, "request_key": 249,
    "unshare": 272, "setns": 308, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "open_by_handle_at": 304, "name_to_handle_at": 303, "open_tree": 428, "move_mount": 429, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442, "syslog": 103, "pidfd_getfd": 438,
    "memfd_create": 319,
    "socket": 41, "clone": 56, "clone3": 435,
}
_AARCH64 = {
    "ptrace": 117, "process_vm_readv": 270, "process_vm_writev": 271, "kexec_load": 104, "kexec_file_load": 294,
    "mount": 40, "umount2": 39, "pivot_root": 41, "chroot": 51, "swapon": 224, "swapoff": 225,
    "reboot": 142, "init_module": 105, "finit_module": 273, "delete_module": 106, "acct": 89, "bpf": 280,
    "perf_event_open": 241, "userfaultfd": 282, "keyctl": 219, "add_key": 217, "request_key": 218,
    "unshare": 97, "setns": 268, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
    "open_by_handle_at": 265, "name_to_handle_at": 264, "open_tree": 428, "move_mount": 429, "fsopen": 430,
    "fsconfig": 431, "fsmount": 432, "fspick": 433, "mount_setattr": 442, "syslog": 116, "pidfd_getfd": 438,
    "memfd_create": 279,
    "socket": 198, "clone": 220, "clone3": 435,
}
# AUDIT_ARCH_* values (linux/audit.h)
ARCHES: dict[str, tuple[int, dict[str, int]]] = {
    "x86_64": (0xC000003E, _X86_64),
    "aarch64": (0xC00000B7, _AARCH64),
}


def syscall_table(machine: str | None = None) -> dict[str, int] | None:
    entry = ARCHES.get(machine or platform.machine())
    return entry[1] if entry else None


def build_filter(machine: str | None = None) -> bytes | None:
    """The compiled filter for this machine, or None where the architecture is not supported."""
    machine = machine or platform.machine()
    if machine not in ARCHES:
        return None
    audit_arch, table = ARCHES[machine]
    eperm = RET_ERRNO | errno.EPERM
    # Program as (op, k, jump-true label, jump-false label); labels resolved below.
    prog: list[tuple[int, int, str | None, str | None]] = [
        (_LD_ABS, _ARCH, None, None),
        (_JEQ, audit_arch, None, "kill"),
        (_LD_ABS, _NR, None, None),
    ]
    if machine == "x86_64":
        prog.append((_JGE, X32_BIT, "kill", None))
    for name in BLOCKED:
        prog.append((_JEQ, table[name], "deny", None))
    prog += [
        (_JEQ, table["clone3"], "enosys", None),
        (_JEQ, table["socket"], "socket", None),
        (_JEQ, table["clone"], "clone", None),
        (_RET, RET_ALLOW, None, None),
        ("socket", 0, None, None),  # type: ignore[list-item]
        (_LD_ABS, _ARG0, None, None),
        (_JEQ, AF_UNIX, "allow", "deny"),
        ("clone", 0, None, None),  # type: ignore[list-item]
        (_LD_ABS, _ARG0, None, None),
        (_JSET, CLONE_NEW_MASK, "deny", "allow"),
        ("allow", 0, None, None),  # type: ignore[list-item]
        (_RET, RET_ALLOW, None, None),
        ("deny", 0, None, None),  # type: ignore[list-item]
        (_RET, eperm, None, None),
        ("enosys", 0, None, None),  # type: ignore[list-item]
        (_RET, RET_ERRNO | errno.ENOSYS, None, None),
        ("kill", 0, None, None),  # type: ignore[list-item]
        (_RET, RET_KILL_PROCESS, None, None),
    ]
    labels: dict[str, int] = {}
    code: list[tuple[int, int, str | None, str | None]] = []
    for op, k, jt, jf in prog:
        if isinstance(op, str):
            labels[op] = len(code)
        else:
            code.append((op, k, jt, jf))
    out = bytearray()
    for index, (op, k, jt, jf) in enumerate(code):
        def rel(label: str | None, index: int = index) -> int:
            if label is None:
                return 0
            offset = labels[label] - index - 1
            if not 0 <= offset <= 255:
                raise ValueError(f"seccomp jump to {label} out of range")
            return offset
        out += struct.pack("=HBBI", op, rel(jt), rel(jf), k)
    return bytes(out)
