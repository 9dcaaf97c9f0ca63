#!/usr/bin/env bash
# Installs the Debian packages a real local node needs, when any is missing (root only):
# runc (the OCI runtime; containerd 2 is built from the Go module proxy: Debian bookworm's 1.6
# has no CDI), the CNI plugins, iproute2 and util-linux
# (namespaces, veth, bridge), iptables (the kubelet's and kube-proxy's chains, inside the
# node's namespace), busybox-static (the local stand-in for the guide's image), and buildah
# with mmdebstrap (the project's images, built from its Dockerfiles on a Debian base), and
# libfaketime (the fault campaign's operator replica whose clock drifted).
set -euo pipefail
packages=(runc containernetworking-plugins iproute2 util-linux iptables busybox-static
  buildah mmdebstrap libfaketime)
missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" \
    || missing+=("$package")
done
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ] || ! command -v apt-get >/dev/null; then
  echo "node-packages: missing ${missing[*]}; install them as root with apt-get (Debian/Ubuntu)" >&2
  exit 1
fi
echo "node-packages: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
