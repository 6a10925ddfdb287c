"""Results, rebuilt from the raw records: statistics, tables, figures, comparisons.

``finalize`` seals a complete host and rebuilds its results; ``analysis`` computes the statistics
per host and cohort, ``trend`` the drift inside a campaign, ``walltime`` where a campaign's wall
time went; ``report`` writes results.csv, report.md and report.html with ``plots`` (SVG through
``svg``, numbers through ``units``); ``compare`` sets two result sets side by side.
"""
