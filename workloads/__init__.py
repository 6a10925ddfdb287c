"""The file workloads: each declared once, with its rounds, fixture builder and oracle model.

In the environment (standard library only, the whole directory bound read-only in every
mode): ``payload`` (the launched bootstrap), ``protocol`` (its body), ``catalog`` and the
workload modules it lists (``writes``, ``reads``, ``working_set``, ``workflow``) built on
``kit``. On the host only: ``registry`` (names, groups, models), ``fixtures``, ``oracle``,
``drive``. Imports point down that list: nothing in the environment imports the host side.
"""
