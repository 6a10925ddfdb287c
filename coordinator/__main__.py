"""``python -m coordinator`` is the ``sandbench`` command."""

from coordinator.cli import main

main(prog_name="sandbench")
