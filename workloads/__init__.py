"""The 19 file workloads: parameters, deterministic fixtures, payload rounds, oracle models.

``workloads/payload.py`` is the in-environment side (standard library only); everything
else here runs on the host.
"""
