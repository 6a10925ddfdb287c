#!/bin/sh
# docker-compose entry of a lab-host worker: make this host's key on its own volume if absent,
# export only its public key (for the coordinator to register), trust the coordinator's exported
# public key (a changed one is refused: this script then stops with both fingerprints), then run
# the worker. It runs only specs that key signed, and no command mode (no worker.toml).
set -eu
host="$1"
sandbench host init --name "$host" --export "/var/lib/sandbench/pubkeys/$host"
coordinator=/var/lib/sandbench/coordinator-pub/coordinator.pub
while [ ! -s "$coordinator" ]; do
  echo "waiting for the coordinator's public key in $coordinator"; sleep 1
done
sandbench host trust-coordinator "$coordinator"
exec sandbench worker --host "$host" --work-root /var/tmp/sandbench
