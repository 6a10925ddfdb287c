#!/bin/sh
# docker-compose entry of a lab-host worker: make this host's key on its own volume if absent,
# export only its public key (for the coordinator to register), then run the worker.
set -eu
host="$1"
sandbench host init --name "$host" --export "/var/lib/sandbench/pubkeys/$host"
exec sandbench worker --host "$host" --work-root /var/tmp/sandbench
