"""Sandboxing shared by every environment that runs untrusted code (see docs/security-sandbox.md).

`bwrap.py` builds the hardened bubblewrap command line and holds the start-up probe.
"""
