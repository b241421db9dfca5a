"""resources/code building blocks: program extraction, output comparison, test plans, seccomp tables."""
from __future__ import annotations

import ctypes
import ctypes.util
import struct

import pytest

from services.core.sandbox import seccomp
from services.resources.code.sandbox import ExecResult
from services.resources.code.verify import Case, classify, extract_program, normalise_output, plan, reward


def test_extract_last_python_block_or_whole_text():
    text = "a\n```python\nprint(1)\n```\nb\n```py\nprint(2)\n```\n```text\nnot code\n```"
    assert extract_program(text) == "print(2)\n"
    assert extract_program("print(3)") == "print(3)"
    assert extract_program("```python\nprint(4)\n") == "print(4)\n"  # cut-off final fence


def test_output_comparison_ignores_trailing_whitespace_per_line_only():
    assert normalise_output("1 \n2\t\n\n") == normalise_output("1\n2")
    assert normalise_output(" 1\n2") != normalise_output("1\n2")
    assert normalise_output("1\n\n2") != normalise_output("1\n2")


def test_assert_style_plans_one_test_per_top_level_assert():
    cases = plan("def f(x): return x", None, "import math\nassert f(1) == 1\nassert f(2) == 3\n", None)
    assert len(cases) == 2 and all("import math" in c.program for c in cases)
    assert "f(2) == 3" in cases[1].program and "f(2) == 3" not in cases[0].program
    check = plan("def g(x): return x", None, "def check(candidate):\n    assert candidate(1) == 1\n", "g")
    assert len(check) == 1 and check[0].program.rstrip().endswith("check(g)")


def test_classification_and_reward_modes():
    ok = classify(Case("", "", "3\n"), ExecResult("3  \n", "", 0))
    wrong = classify(Case("", "", "3"), ExecResult("4", "", 0))
    mem = classify(Case(""), ExecResult("", "Traceback...\nMemoryError\n", 1))
    slow = classify(Case(""), ExecResult("", "", None, timed_out=True))
    xcpu = classify(Case(""), ExecResult("", "", 152))
    assert ok["passed"] and wrong["failure_kind"] == "wrong_answer"
    assert mem["failure_kind"] == "memory" and slow["failure_kind"] == "timeout" and xcpu["failure_kind"] == "timeout"
    assert reward([ok, wrong], "fraction") == 0.5 and reward([ok, wrong], "all") == 0.0


@pytest.mark.parametrize("machine", sorted(seccomp.ARCHES))
def test_seccomp_tables_match_libseccomp(machine):
    """Our hand-written syscall numbers agree with libseccomp's (installed with bubblewrap's deps)."""
    lib = ctypes.CDLL(ctypes.util.find_library("seccomp") or "libseccomp.so.2")
    resolve = lib.seccomp_syscall_resolve_name_arch
    resolve.restype = ctypes.c_int
    audit_arch, table = seccomp.ARCHES[machine]
    wrong = {name: (nr, resolve(ctypes.c_uint32(audit_arch), name.encode())) for name, nr in table.items()
             if resolve(ctypes.c_uint32(audit_arch), name.encode()) != nr}
    assert wrong == {}


def test_seccomp_program_is_well_formed():
    program = seccomp.build_filter("x86_64")
    assert program is not None and len(program) % 8 == 0
    ops = [struct.unpack("=HBBI", program[i:i + 8]) for i in range(0, len(program), 8)]
    assert ops[0] == (0x20, 0, 0, 4)  # load arch first
    assert all(code != 0x06 or k in (seccomp.RET_ALLOW, seccomp.RET_KILL_PROCESS) or k >> 16 == 5
               for code, _, _, k in ops)
    assert (0x15, ops[[o[3] for o in ops].index(101)][1], 0, 101) in ops  # ptrace is matched
    assert seccomp.build_filter("sparc") is None
