#!/bin/sh
# docker-compose entry of the coordinator: make the coordinator's key if absent and export its
# public half (the workers trust it: they run only specs it signed), wait for each lab host's
# exported public key, trust it (a key that changed under a known name is refused: this script
# then stops with the reason), then run the coordinator next to the store. No host's private
# key is ever visible here.
set -eu
sandbench coordinator init --quiet --export /var/lib/sandbench/coordinator-pub
pubkeys=/var/lib/sandbench/pubkeys
for host in $(echo "${SANDBENCH_FLEET_HOSTS:-lab-a,lab-b}" | tr ',' ' '); do
  while [ ! -s "$pubkeys/$host/$host.pub" ]; do
    echo "waiting for the public key of $host in $pubkeys/$host"; sleep 1
  done
  sandbench hosts add "$host" "$(cat "$pubkeys/$host/$host.pub")"
done
exec sandbench coordinator --data /var/lib/sandbench/data
