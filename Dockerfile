# One image for every fleet service (redis, coordinator, lab-host workers, flower), built from
# this repository by `docker-compose up --build`. The base is Debian bookworm: from a registry
# (debian:bookworm-slim), or made from Debian's archive by ops/base-image.sh where no container
# registry is reachable (then BASE_IMAGE=sandbench-base:bookworm). Package installs need the
# network at build time (`build: network: host` in docker-compose.yml).
ARG BASE_IMAGE=debian:bookworm-slim
FROM ${BASE_IMAGE}

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
# Dependencies first (their layer is rebuilt only when pyproject.toml changes), then the package.
# PIP_CERT: pip trusts the system CA store, which includes any local CA the base image carries.
ENV PIP_CERT=/etc/ssl/certs/ca-certificates.crt \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1
COPY pyproject.toml ./
RUN python3 -m venv /opt/sandbench/venv \
 && python3 -c 'import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"], sep="\n")' \
      > /tmp/requirements.txt \
 && /opt/sandbench/venv/bin/pip install -r /tmp/requirements.txt
COPY README.md ./
COPY coordinator ./coordinator
COPY worker ./worker
COPY contract ./contract
COPY workloads ./workloads
COPY ops ./ops
COPY testbed ./testbed
RUN /opt/sandbench/venv/bin/pip install --no-deps . \
 && install -m 0644 ops/redis.conf /etc/redis/sandbench.conf

CMD ["sandbench", "--help"]
