"""The fleet transport: a campaign dispatched through the broker to lab hosts.

``dispatch`` stores the expanded campaign and queues each host's environments; ``coordinator``
is the coordinator process's tasks (verify, store, finalize, lost runs); ``intake`` takes the
records off the broker in batches; ``leases`` requeues environments never started; ``status``
shows a campaign's progress; ``flower`` runs the read-only live view.
"""
