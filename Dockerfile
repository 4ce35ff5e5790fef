# One image for every ROSE component, with the `rose` entry point:
#   docker build -t ghcr.io/rose-project/rose:0.1.0 .                  # rose (runs as 65532)
#   docker build --target driver -t ghcr.io/rose-project/rose-driver:0.1.0 .
# Without a Docker engine: hack/build-image.sh (buildah, vfs storage, an OCI archive in dist/).
#
# Stages: `deps` and `deps-driver` install the dependencies from wheels (no compiler is installed anywhere;
# every dependency ships a manylinux wheel), `build` and `build-driver` add ROSE on top; `driver`
# carries only what the DRA node driver imports
# (grpcio, protobuf, kubernetes, pydantic, prometheus-client, PyYAML, filelock); the last stage is
# the default image with every component (extender, predictor, controller, CLI).
# BASE is any Debian-based image with python3 >= 3.11 and its venv module on PATH.
ARG BASE=python:3.11-slim-bookworm

# The dependency lists, from pyproject.toml alone: the layers that install them stay cached (buildah
# --layers, docker build) until pyproject.toml changes, whatever the source does.
FROM ${BASE} AS requirements
WORKDIR /src
COPY pyproject.toml ./
RUN python3 -c "import re, tomllib; keep = {'kubernetes', 'grpcio', 'protobuf', 'pydantic', 'prometheus-client', 'pyyaml', 'filelock', 'typing_extensions'}; deps = tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']; open('requirements.txt', 'w').write('\n'.join(deps) + '\n'); open('driver-requirements.txt', 'w').write('\n'.join(d for d in deps if re.split(r'[<>=!~ ;\[]', d)[0].lower() in keep) + '\n')"

# A TLS-intercepting proxy's CA can be handed in as the build secret `ca-bundle` (hack/build-image.sh
# passes the host's bundle): pip uses it, no layer keeps it.
FROM ${BASE} AS deps
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ONLY_BINARY=:all:
COPY --from=requirements /src/requirements.txt /src/requirements.txt
RUN --mount=type=secret,id=ca-bundle \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
 && python3 -m venv /opt/rose \
 && /opt/rose/bin/pip install -r /src/requirements.txt \
 && find /opt -name __pycache__ -prune -exec rm -rf {} +

# The driver's dependencies, in a venv at the same path (a venv's scripts name their interpreter's path).
FROM ${BASE} AS deps-driver
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_ONLY_BINARY=:all:
COPY --from=requirements /src/driver-requirements.txt /src/driver-requirements.txt
RUN --mount=type=secret,id=ca-bundle \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
 && python3 -m venv /opt/rose \
 && /opt/rose/bin/pip install -r /src/driver-requirements.txt \
 && find /opt -name __pycache__ -prune -exec rm -rf {} +

# ROSE's source (what .dockerignore lets through), then ROSE itself on each environment: every
# component in `build`, the driver's in `build-driver`.
FROM scratch AS source
COPY . /src/

FROM deps AS build
COPY --from=source /src /src
WORKDIR /src
RUN --mount=type=secret,id=ca-bundle \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
 && /opt/rose/bin/pip install --no-deps --no-binary=rose . \
 && find /opt -name __pycache__ -prune -exec rm -rf {} +

FROM deps-driver AS build-driver
COPY --from=source /src /src
WORKDIR /src
RUN --mount=type=secret,id=ca-bundle \
    if [ -s /run/secrets/ca-bundle ]; then export PIP_CERT=/run/secrets/ca-bundle; fi \
 && /opt/rose/bin/pip install --no-deps --no-binary=rose . \
 && find /opt -name __pycache__ -prune -exec rm -rf {} +

# The DRA node driver: runs as root (hostPID, ptrace of workload processes for the suspend
# backends, kubelet plugin sockets and CDI specs on host paths; manifests/driver/daemonset.yaml
# drops every capability but SYS_PTRACE and DAC_READ_SEARCH).
FROM ${BASE} AS driver
COPY --from=build-driver /opt/rose /opt/rose
ENV PATH=/opt/rose/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
ENTRYPOINT ["rose"]
CMD ["--help"]

# Every other component: non-root.
FROM ${BASE} AS rose
COPY --from=build /opt/rose /opt/rose
ENV PATH=/opt/rose/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 65532:65532
ENTRYPOINT ["rose"]
CMD ["--help"]
