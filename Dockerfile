# One image for every fleet service (redis, coordinator, lab-host workers, flower), built from
# this repository: `docker compose build`. Only the base image comes from a registry.
FROM debian:bookworm-slim

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    SANDBENCH_HOME=/var/lib/sandbench/home \
    PATH=/opt/sandbench/venv/bin:$PATH

# The toolset every mode runs (payload, workloads), the host sandbox, and the broker.
RUN apt-get update -q \
 && apt-get install -y -q --no-install-recommends \
      python3 python3-venv git gcc make libc6-dev bubblewrap util-linux iproute2 e2fsprogs \
      redis-server ca-certificates \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/sandbench/src
COPY pyproject.toml README.md ./
COPY coordinator ./coordinator
COPY worker ./worker
COPY tasks ./tasks
COPY workloads ./workloads
COPY ops ./ops
RUN python3 -m venv /opt/sandbench/venv \
 && /opt/sandbench/venv/bin/pip install --no-cache-dir --disable-pip-version-check . \
 && install -m 0644 ops/redis.conf /etc/redis/sandbench.conf

VOLUME ["/var/lib/sandbench"]
CMD ["sandbench", "--help"]
