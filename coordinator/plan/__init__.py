"""Planning: the plan file, its modes, the sentinel's calibrations, the campaign's expansion.

``file`` validates a plan (TOML), ``modes`` names its modes, ``sentinel`` declares the
calibration environments, ``campaign`` expands a plan per host into environments in a seeded run
order. Nothing here touches the store, a broker or a mode.
"""
