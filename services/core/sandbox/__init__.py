"""Sandboxing shared by every environment that runs untrusted code (see docs/security-sandbox.md and
docs/sandboxes.md).

`bwrap.py` builds the hardened bubblewrap command line and holds the start-up probe. Workspaces
(terminal, swe): `workspace.py` is the abstraction, `folder.py` (bubblewrap over a host folder)
and `docker.py` the providers, `pool.py` the warm pool, `owner.py` the janitor's owner markers,
`process.py` the bounded subprocess runner, `environment.py` the environment base with the tools.
"""
