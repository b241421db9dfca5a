"""Sandboxed workspaces shared by every environment that runs untrusted commands (terminal, swe).

`workspace.py` is the abstraction, `bwrap.py` and `docker.py` the providers, `pool.py` the warm
pool and `janitor.py` what reclaims a dead server's leftovers.
"""
