"""The campaign store: where records are kept, chained, finalized and verified.

``store`` is the directory of one campaign (plan, expansion, provenance, one log per host);
``hostlog`` a host's append-only log, ``chain`` what the coordinator key signs in it, ``views`` the
fast read views of its lines, ``trust`` the registry of trusted keys, ``progress`` planned versus
recorded environments, ``policy`` the first-failure rule re-derived, ``verify`` what ``sandbench
verify`` checks and ``verdict`` its signed verdict.
"""
