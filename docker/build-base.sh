#!/usr/bin/env bash
# Build and import a Debian bookworm base image for the action's Dockerfile when no container
# registry is reachable: debootstrap --variant=minbase, the host's extra CA certificates copied
# in (so pip inside `docker build` trusts this machine's HTTPS), then `docker import`.
# Usage: docker/build-base.sh TAG   (reuses TAG when the image exists; needs root)
set -euo pipefail
tag=${1:?usage: build-base.sh TAG}
if docker image inspect "$tag" >/dev/null 2>&1; then
  echo "base image $tag: cached"
  exit 0
fi
mirror=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
work=$(mktemp -d "${TMPDIR:-/tmp}/bi-rootfs.XXXXXX")
trap 'rm -rf "$work"' EXIT
root="$work/rootfs"
echo "base image $tag: debootstrap --variant=minbase bookworm from $mirror"
debootstrap --variant=minbase bookworm "$root" "$mirror" >"$work/debootstrap.log" 2>&1 || {
  tail -n 20 "$work/debootstrap.log" >&2
  exit 1
}
mkdir -p "$root/usr/local/share/ca-certificates" "$root/etc/ssl/certs"
if compgen -G "/usr/local/share/ca-certificates/*" >/dev/null; then
  cp -a /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/"
fi
# The host bundle already holds the extra CAs; the image's ca-certificates package (installed by
# the Dockerfile) regenerates it from the folder above.
cp /etc/ssl/certs/ca-certificates.crt "$root/etc/ssl/certs/ca-certificates.crt"
rm -rf "$root/var/cache/apt/archives/"*.deb "$root/var/lib/apt/lists/"*
tar -C "$root" -c . | docker import \
  --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
  --change 'CMD ["/bin/bash"]' - "$tag" >/dev/null
echo "base image $tag: imported"
