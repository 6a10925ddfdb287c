"""sandbench coordinator, in the order of the data flow: plan, local or fleet, store, results.

``plan`` validates a plan and expands a campaign; ``local`` (embedded) or ``fleet`` (broker)
runs it; ``store`` keeps, chains and verifies the records; ``results`` finalizes hosts and makes
the tables, report and comparisons; ``cli`` is the command line.

Glossary (use these words, and only these, for these things):

campaign
    One registered run of a plan; has an id, a seed and a cohort label.
plan
    Workloads x modes x environments (default 3) x rounds (default 3), plus quota and
    limits; a validated TOML file.
host
    One lab machine; results are always computed per host.
mode
    An execution mode: how the workload is launched (native, the bubblewrap sandbox mode
    named ``host``, staged, docker, podman, vm, ...).
workload
    One of the file tasks (the design's 19, each declared once in ``workloads/``):
    deterministic inputs, a round function, a validator, an oracle model.
cell
    (host, mode, workload).
environment
    One fresh instance of a cell: fresh workspace and sandbox/container/VM; runs
    ``rounds`` dependent rounds.
round
    One unit of work inside an environment; round k sees the state left by round k-1.
Ready
    Milliseconds from the shared pre-exec marker to the host receiving the payload's
    ready line.
task time
    Seconds of one round: work plus its final synchronization, host-observed.
record
    A signed result of one environment (its rounds, Ready, outcome).
cohort
    Label that keeps campaigns apart: results of two cohorts are never pooled.
sentinel
    The machine-state sentinel: fixed calibration environments (``sentinel-cpu``,
    ``sentinel-fsync``; native, not workloads) run at the start of a campaign, every K
    environments and at the end; recorded like every environment but in no cell
    (``coordinator.plan.sentinel``).
"""
