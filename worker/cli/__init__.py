"""The lab host's own commands: its worker, its checks, its leftovers, its daemons, its guests.

``sandbench`` (``coordinator.cli``) registers them beside the coordinator's commands; nothing
here imports the coordinator, so a lab host's commands run on what a lab host has.
"""
