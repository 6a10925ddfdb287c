"""The wire contract: what lab hosts and the coordinator agree on, and nothing else.

Spec and record schemas (``records``), errors, signing, where state lives (``paths``), the Celery
app's configuration with its task and queue names (``app``) and the Redis keys hosts keep
(``broker``). This package imports nothing from ``workloads``, ``worker`` or ``coordinator``;
importing it does not import Celery (only ``contract.app`` does).
"""
