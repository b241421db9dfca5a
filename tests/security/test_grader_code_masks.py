"""A program cannot turn its own failure into a masked sample: whatever it does to the sandbox it runs
in (signal its pid 1, kill everything it can reach, close or flood its channels), its failing tests
score as failures and `mask_sample` stays false. Only our infrastructure failing masks."""
from __future__ import annotations

import pytest

from gymserve.testing import ServerProcess, verify_body
from tests.security.code_sandbox import assert_healthy, server  # noqa: F401

# each one fails its test (a wrong answer), then attacks the sandbox's supervisor
SELF_MASKING = {
    "sigint_pid1": "import os, signal\nos.kill(1, signal.SIGINT)\nassert 1 == 2\n",
    "sigint_parent": "import os, signal\nos.kill(os.getppid(), signal.SIGINT)\nassert 1 == 2\n",
    "sigint_pid1_repeated": "import os, signal, time\nfor _ in range(50):\n    os.kill(1, signal.SIGINT)\n"
                            "    time.sleep(0.001)\nassert 1 == 2\n",
    "sigterm_sighup_sigusr_pid1": "import os, signal\nfor s in (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1,"
                                  " signal.SIGUSR2, signal.SIGQUIT, signal.SIGALRM, signal.SIGPIPE):\n"
                                  "    try:\n        os.kill(1, s)\n    except OSError:\n        pass\n"
                                  "assert 1 == 2\n",
    "kill_all": "import os\ntry:\n    os.kill(-1, 9)\nexcept OSError:\n    pass\nassert 1 == 2\n",
    "sigstop_pid1": "import os, signal\nos.kill(1, signal.SIGSTOP)\nassert 1 == 2\n",
    "close_inherited_fds": "import os\nos.closerange(0, 1024)\nos._exit(1)\n",
}


def verify(server: ServerProcess, program: str) -> dict:
    # two asserts: two cases in one batch sandbox, so the runner (pid 1) is really in play
    reply = server.post("/verify", verify_body(f"```python\n{program}\n```", test_code="assert True\nassert True\n"))
    assert reply.status_code == 200, reply.text
    return reply.json()


@pytest.mark.parametrize("name", sorted(SELF_MASKING))
def test_failing_program_that_attacks_pid1_is_scored_not_masked(server: ServerProcess, name: str) -> None:
    body = verify(server, SELF_MASKING[name])
    assert body["mask_sample"] is False, body
    assert body["reward"] == 0.0, body
    assert_healthy(server)


def test_a_passing_program_still_passes_after_a_sigint(server: ServerProcess) -> None:
    """SIGINT to pid 1 does nothing to the runner: the program's own KeyboardInterrupt still works."""
    program = ("import os, signal\nos.kill(1, signal.SIGINT)\n"
               "try:\n    os.kill(os.getpid(), signal.SIGINT)\n    import time; time.sleep(1)\n"
               "except KeyboardInterrupt:\n    pass\n")
    body = verify(server, program)
    assert body["mask_sample"] is False and body["reward"] == 1.0, body
