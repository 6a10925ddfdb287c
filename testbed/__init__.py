"""Machines made on this machine to try sandbench on: the lab of systemd hosts (ops/lab.sh) and
the cgroup v2 lab host (``v2host``, ops/v2-host.sh), both guests booted from this root."""
