# The batch-invariance GitHub Action image.
#
# Which GPUs the container sees is the job's choice, not the image's: the action's `gpus`
# input (docker run --gpus) or the runner's CUDA_VISIBLE_DEVICES / NVIDIA_VISIBLE_DEVICES,
# which action/run-container.sh passes through. This image sets no NVIDIA_VISIBLE_DEVICES (a
# CUDA base image may set its own, as nvidia/cuda's do: `gpus` still narrows it).
#
# BASE_IMAGE is a build argument. The default is a CUDA 12 *runtime* image (Ubuntu 22.04,
# glibc 2.35), so a llama-server built on the runner against CUDA 12 finds libcudart/libcublas.
# A server linked against a newer glibc (Ubuntu 24.04: 2.39) or CUDA 13 needs another base,
# e.g. --build-arg BASE_IMAGE=nvidia/cuda:13.0.1-runtime-ubuntu24.04, or a static build; the
# entrypoint's preflight names what is missing (docs/action.md, "Which server builds fit").
# Any Debian/Ubuntu base with apt works (the tests build it on a debootstrapped bookworm).
ARG BASE_IMAGE=nvidia/cuda:12.4.1-runtime-ubuntu22.04
FROM ${BASE_IMAGE}

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# Distribution packages track the base image's security updates; pinning exact versions
# would break the build each time the archive moves on. The toolchain and cmake let
# `mode: live` without server-bin build the embedded CPU default inside the container; ldd
# (libc-bin) is what the preflight runs on a mounted server binary.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        python3 python3-venv python3-pip ca-certificates libc-bin build-essential cmake \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/batch-invariance
COPY pyproject.toml README.md LICENSE NOTICE ./

# Dependencies first, in their own layer, from the same pyproject (an empty package stands in
# for the source), so a source change does not download them again. pip trusts the system CA
# bundle, which holds any extra CA the base image was given.
RUN mkdir -p src/batch_invariance \
    && touch src/batch_invariance/__init__.py \
    && python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --cert /etc/ssl/certs/ca-certificates.crt ".[demo]" \
    && /opt/venv/bin/pip uninstall -y batch-invariance \
    && rm -rf src build

COPY src ./src
RUN /opt/venv/bin/pip install --no-deps . \
    && /opt/venv/bin/python -c "import batch_invariance.action.container"

ENV PATH=/opt/venv/bin:$PATH

# GitHub runs Docker actions as root with the workspace owned by the runner user; the
# entrypoint hands every file it wrote back to the workspace's owner (actions/runner#434).
# (USER 0 is root, by number.)
# hadolint ignore=DL3002
USER 0

ENTRYPOINT ["/opt/venv/bin/python", "-m", "batch_invariance.action.container"]
