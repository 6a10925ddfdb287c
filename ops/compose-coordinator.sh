#!/bin/sh
# docker-compose entry of the coordinator: wait for every lab host's key in the shared volume,
# trust them, then run the coordinator next to the store.
set -eu
homes=/var/lib/sandbench/home
for host in $(echo "${SANDBENCH_FLEET_HOSTS:-lab-a,lab-b}" | tr ',' ' '); do
  while [ ! -s "$homes/$host/host.key" ]; do
    echo "waiting for the key of $host in $homes/$host"; sleep 2
  done
  pub=$(python -c 'import sys
from tasks.signing import HostKey
print(HostKey.load(sys.argv[1]).public_b64())' "$homes/$host/host.key")
  sandbench hosts add "$host" "$pub" || true
done
exec sandbench coordinator --data /var/lib/sandbench/data
