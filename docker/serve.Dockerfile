# batch-invariance serve on llama.cpp's official server image (docs/deploy.md, "Containers:
# the serve image"). Build from the repository root:
#
#   docker build -f docker/serve.Dockerfile \
#     --build-arg LLAMA_IMAGE=ghcr.io/ggml-org/llama.cpp:server@sha256:<64 hex> -t NAME:TAG .
#
# The image adds Python and this tool; it never writes under /app, so the server binary and
# the libraries beside it are the official image's bytes, and the build fails if installing
# Python changed any library the server loads. Its entrypoint is `batch-invariance serve`: the
# container's command is `--certs DIR [policy] -- /app/llama-server ARGS...`, and serve starts
# the server only where a cert in DIR measured exactly that command. The official image's
# LLAMA_ARG_HOST=0.0.0.0 is dropped by serve (it drops every LLAMA_ARG_*): write --host.
ARG LLAMA_IMAGE=ghcr.io/ggml-org/llama.cpp:server
FROM ${LLAMA_IMAGE}

# Build-time settings only: the image adds no ENV of its own.
ARG DEBIAN_FRONTEND=noninteractive
ARG PIP_DISABLE_PIP_VERSION_CHECK=1
ARG PIP_NO_CACHE_DIR=1

SHELL ["/bin/bash", "-o", "pipefail", "-c"]

# The files the server runs or loads (everything in /app, and what ldd resolves for the binary
# and the libraries beside it) are hashed before apt and checked after: apt may upgrade a
# dependency it shares with Python (libc, libstdc++, libssl), which would change what the cert
# measured. Distribution packages track the base image's updates; pinning exact versions would
# break the build each time the archive moves on (Ubuntu and Debian bases alike).
# hadolint ignore=DL3008
RUN find /app -type f -print >/tmp/served.app \
    && { grep -E '/llama-server$|\.so' /tmp/served.app | xargs -r ldd 2>/dev/null || true; } \
        | awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\/.*[^:]$/ { print $1 }' \
        >/tmp/served.libs \
    && sort -u /tmp/served.app /tmp/served.libs | xargs -r -d '\n' sha256sum >/tmp/served.sha256 \
    && apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && { sha256sum --quiet -c /tmp/served.sha256 || { echo "installing Python changed a file" \
        "the server loads (above): build on a newer LLAMA_IMAGE" >&2; exit 1; }; } \
    && rm -f /tmp/served.app /tmp/served.libs /tmp/served.sha256

# Dependencies first, in their own layer, from the same pyproject (an empty package stands in
# for the source), so a source change does not download them again. pip trusts the system CA
# bundle, which holds any extra CA the base image was given.
COPY pyproject.toml README.md LICENSE NOTICE /opt/batch-invariance/
RUN mkdir -p /opt/batch-invariance/src/batch_invariance \
    && touch /opt/batch-invariance/src/batch_invariance/__init__.py \
    && python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --cert /etc/ssl/certs/ca-certificates.crt /opt/batch-invariance \
    && /opt/venv/bin/pip uninstall -y batch-invariance \
    && rm -rf /opt/batch-invariance/src /opt/batch-invariance/build

COPY src /opt/batch-invariance/src
RUN /opt/venv/bin/pip install --no-deps /opt/batch-invariance \
    && rm -rf /opt/batch-invariance \
    && ln -s /opt/venv/bin/batch-invariance /usr/local/bin/batch-invariance \
    && /usr/local/bin/batch-invariance serve --help >/dev/null

# Runs as the official image does (root, no USER): serve execs the server in its place.
ENTRYPOINT ["/usr/local/bin/batch-invariance", "serve"]
