"""The wire contract: record and spec schemas, signing, and (in ``tasks.app``) the Celery app.

Importing this package does not import Celery; only ``tasks.app`` and ``tasks.fleet`` do.
"""
