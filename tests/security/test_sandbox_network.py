"""No network from the sandbox: not the server's own port, not an outside address (TEST-NET, no traffic)."""
from __future__ import annotations

from services.resources.code.sandbox import Limits, Sandbox
from tests.security.code_sandbox import assert_healthy, run, server  # noqa: F401 (fixture)

CONNECT = """
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
s.settimeout(5)
s.connect(({host!r}, {port}))
print("CONNECTED")
"""


def test_socket_to_the_servers_own_port_fails(server):
    result = run(server, CONNECT.format(host="127.0.0.1", port=server.port))
    assert result["failure_kind"] == "runtime_error"
    assert "PermissionError" in result["stderr"] or "unreachable" in result["stderr"]
    assert "timed out" not in result["stderr"]  # refused at once, not a connect that waited for its timeout
    assert_healthy(server)


def test_socket_to_an_outside_address_fails_fast(server):
    result = run(server, CONNECT.format(host="192.0.2.1", port=80))
    assert result["failure_kind"] == "runtime_error"
    assert "timed out" not in result["stderr"]  # refused (no route), not a connect left waiting
    assert "PermissionError" in result["stderr"] or "unreachable" in result["stderr"], result["stderr"]
    assert_healthy(server)


async def test_network_namespace_alone_blocks_without_seccomp():
    """With the seccomp filter off, the empty network namespace still has no route anywhere."""
    sandbox = Sandbox("bwrap", seccomp=False)
    await sandbox.start()
    try:
        program = (
            "import socket, errno\n"
            "for host in ('127.0.0.1', '192.0.2.1'):\n"
            "    s = socket.socket(); s.settimeout(5)\n"
            "    try:\n"
            "        s.connect((host, %d)); print(host, 'CONNECTED')\n"
            "    except OSError as exc:\n"
            "        print(host, errno.errorcode.get(exc.errno, exc))\n" % 80)
        result = await sandbox.run(program, b"", Limits(wall_s=10))
        assert result.exit_code == 0, result
        assert "CONNECTED" not in result.stdout
        assert "127.0.0.1 ECONNREFUSED" in result.stdout or "127.0.0.1 ENETUNREACH" in result.stdout
        assert "192.0.2.1 ENETUNREACH" in result.stdout
    finally:
        await sandbox.close()
