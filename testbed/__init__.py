"""Machines made on this machine to try sandbench on: the lab of systemd hosts (ops/lab.sh)."""
