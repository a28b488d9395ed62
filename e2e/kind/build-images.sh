#!/usr/bin/env bash
# Builds, offline, every container image the kind cluster runs, into the local Docker
# engine, each skipped when its tag is there already (tags carry the versions and this
# script's revision, so a change rebuilds):
#
#   modelpool/debian-root:<rev>      a Debian root from debootstrap (systemd, containerd,
#                                    runc, iptables, python3, pip): the node's root and the
#                                    base of every image below that needs more than a binary
#   registry.k8s.io/...              what kubeadm and kind ask for (the control plane,
#                                    kube-proxy, etcd, CoreDNS, pause), each a static binary
#                                    in a tiny root, or on debian-root where it needs iptables
#   modelpool/flannel:<v>            flanneld and the CNI plugins its init container installs
#   modelpool/kind-node:<k8s>-<rev>  kind's node: its base files (from the kind module), the
#                                    kubelet, kubeadm, kubectl, crictl and CNI plugins, and
#                                    the images above, imported into containerd at boot
#   modelpool/kind-node:<k8s>-<rev>-containerd-<v>
#                                    only with MODELPOOL_KIND_CONTAINERD=<v>: that node with
#                                    containerd <v> (build-containerd.sh) in place of
#                                    Debian's 1.6, which has no CDI (a DRA driver needs it)
#
# Where kind's official node image can be pulled (kindest/node), up.sh uses that instead and
# only the modelpool images are built. Prints the node image's name as its last line;
# `build-images.sh --root` builds and prints only the Debian root.
#
# Environment: MODELPOOL_CACHE, MODELPOOL_K8S_VERSION, MODELPOOL_DEBIAN_MIRROR (default: the
# archive apt on this machine is configured to fetch bookworm from: debian-mirror.sh),
# MODELPOOL_KIND_CONTAINERD (unset: the node runs Debian's containerd).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
K8S_VERSION="${MODELPOOL_K8S_VERSION:-v1.35.4}"
KIND_VERSION=v0.33.0
FLANNEL_VERSION=v0.28.10
COREDNS_VERSION=v1.13.1
# Bump when what this script puts into the Debian root, or into the node, changes.
ROOT_REV=4
REV=6
CACHE="${MODELPOOL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/modelpool}"
WORK="$CACHE/kind/images"
ROOT_IMAGE="modelpool/debian-root:bookworm-r$ROOT_REV"
NODE_IMAGE="modelpool/kind-node:$K8S_VERSION-r$REV"
FLANNEL_IMAGE="modelpool/flannel:$FLANNEL_VERSION-r$REV"

log() { printf '[kind-images %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
have() { docker image inspect "$1" >/dev/null 2>&1; }

if [[ ${1:-} != --root ]]; then
  TOOLS="$(bash "$here/build-tools.sh" | tail -n 1)"
  CONTROL_PLANE="$(bash "$here/../build-control-plane.sh" | tail -n 1)"
fi
mkdir -p "$CACHE/kind/work"
KIND_SRC="$(cd "$CACHE/kind/work" && GOFLAGS= go mod download -json "sigs.k8s.io/kind@$KIND_VERSION" | sed -n 's/.*"Dir": "\(.*\)".*/\1/p')"
mkdir -p "$WORK"

# --- the Debian root -----------------------------------------------------------------------

# libgomp1: llama-server's one runtime library beyond what python3 brings.
PACKAGES=systemd,systemd-sysv,dbus,containerd,runc,iptables,nftables,conntrack,iproute2,ethtool,util-linux,mount,kmod,libseccomp2,pigz,e2fsprogs,bash,ca-certificates,curl,jq,procps,socat,python3,python3-pip,libgomp1

build_root() {
  command -v debootstrap >/dev/null || {
    log "installing debootstrap (Debian package)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q debootstrap >/dev/null
  }
  local dir="$WORK/root-r$ROOT_REV" mirror
  mirror="$(bash "$here/debian-mirror.sh" bookworm)"
  rm -rf "$dir"
  log "debootstrap bookworm from $mirror (about 2 minutes)"
  local start=$SECONDS
  debootstrap --variant=minbase --include="$PACKAGES" bookworm "$dir" "$mirror" >"$WORK/debootstrap.log" 2>&1 || {
    tail -n 20 "$WORK/debootstrap.log" >&2; exit 1; }
  # What kind's base image does (images/base/Dockerfile of the kind module), with Debian's
  # containerd and runc linked where kind's files expect them.
  cp -R "$KIND_SRC/images/base/files/etc/." "$dir/etc/"
  mkdir -p "$dir/kind" && cp -R "$KIND_SRC/images/base/files/kind/." "$dir/kind/"
  cp "$KIND_SRC/images/base/files/usr/local/bin/"* "$dir/usr/local/bin/"
  chmod -R u+w,go+rX "$dir/etc" "$dir/kind" && chmod 0755 "$dir/kind/bin/"* "$dir/usr/local/bin/"*
  ln -sf /usr/bin/containerd "$dir/usr/local/bin/containerd"
  ln -sf /usr/bin/ctr "$dir/usr/local/bin/ctr"
  ln -sf /usr/bin/containerd-shim-runc-v2 "$dir/usr/local/bin/containerd-shim-runc-v2"
  mkdir -p "$dir/usr/local/sbin" && ln -sf /usr/sbin/runc "$dir/usr/local/sbin/runc"
  chroot "$dir" sh -euc '
    ctr oci spec | jq ".hooks.createContainer[.hooks.createContainer| length] |= . + {\"path\": \"/kind/bin/mount-product-files.sh\"}" | jq "del(.process.rlimits)" > /etc/containerd/cri-base.json
    find /lib/systemd/system/sysinit.target.wants/ -name "systemd-tmpfiles-setup.service" -delete
    rm -f /lib/systemd/system/multi-user.target.wants/* /etc/systemd/system/*.wants/* \
      /lib/systemd/system/local-fs.target.wants/* /lib/systemd/system/sockets.target.wants/*udev* \
      /lib/systemd/system/sockets.target.wants/*initctl* /lib/systemd/system/basic.target.wants/*
    echo "ReadKMsg=no" >> /etc/systemd/journald.conf
    systemctl enable kubelet.service containerd.service undo-mount-hacks.service >/dev/null 2>&1
    systemctl mask systemd-binfmt.service >/dev/null 2>&1
    mkdir -p /etc/kubernetes/manifests
    apt-get clean
  '
  rm -rf "$dir/var/lib/apt/lists/"* "$dir/usr/share/doc" "$dir/usr/share/man"
  tar -C "$dir" -c . | docker import - "$ROOT_IMAGE" >/dev/null
  rm -rf "$dir"
  log "$ROOT_IMAGE: done in $((SECONDS - start))s"
}

# --- component images ------------------------------------------------------------------------

# tiny IMAGE ENTRYPOINT_JSON FILE...: a root holding only the given static binaries in
# /usr/local/bin (and the entrypoint), imported as IMAGE.
tiny() {
  local image="$1" entrypoint="$2"; shift 2
  have "$image" && return 0
  local dir="$WORK/tiny"
  rm -rf "$dir" && mkdir -p "$dir/usr/local/bin" "$dir/etc" "$dir/tmp" && chmod 1777 "$dir/tmp"
  printf 'root:x:0:0:root:/:/sbin/nologin\nnobody:x:65534:65534:nobody:/:/sbin/nologin\n' >"$dir/etc/passwd"
  printf 'root:x:0:\nnobody:x:65534:\n' >"$dir/etc/group"
  local f
  for f in "$@"; do cp "$f" "$dir/usr/local/bin/"; done
  tar -C "$dir" -c . | docker import \
    --change 'ENV PATH=/usr/local/bin:/usr/bin:/bin' \
    --change "ENTRYPOINT $entrypoint" - "$image" >/dev/null
  log "$image: built"
}

# on_root IMAGE DOCKERFILE_BODY FILE...: IMAGE from debian-root with FILEs in its context.
on_root() {
  local image="$1" body="$2"; shift 2
  have "$image" && return 0
  local dir="$WORK/ctx"
  rm -rf "$dir" && mkdir -p "$dir"
  local f
  for f in "$@"; do cp -R "$f" "$dir/"; done
  printf 'FROM %s\n%s\n' "$ROOT_IMAGE" "$body" >"$dir/Dockerfile"
  DOCKER_BUILDKIT=0 docker build -q -t "$image" "$dir" >/dev/null 2>&1 || {
    DOCKER_BUILDKIT=0 docker build -t "$image" "$dir" >&2; exit 1; }
  log "$image: built"
}

build_components() {
  local k=registry.k8s.io
  tiny "$k/kube-apiserver:$K8S_VERSION" '["/usr/local/bin/kube-apiserver"]' "$CONTROL_PLANE/kube-apiserver"
  tiny "$k/kube-controller-manager:$K8S_VERSION" '["/usr/local/bin/kube-controller-manager"]' "$CONTROL_PLANE/kube-controller-manager"
  tiny "$k/kube-scheduler:$K8S_VERSION" '["/usr/local/bin/kube-scheduler"]' "$CONTROL_PLANE/kube-scheduler"
  # kubeadm 1.35.4 asks for etcd 3.6.6-0; the testbed's etcd release stands in for it.
  tiny "$k/etcd:3.6.6-0" '["/usr/local/bin/etcd"]' "$CONTROL_PLANE/etcd"
  tiny "$k/pause:3.10.1" '["/usr/local/bin/pause"]' "$TOOLS/pause"
  # kind's containerd config names this one as the sandbox image.
  have "$k/pause:3.10" || docker tag "$k/pause:3.10.1" "$k/pause:3.10"
  tiny "$k/coredns/coredns:$COREDNS_VERSION" '["/usr/local/bin/coredns"]' "$TOOLS/coredns"
  # kube-proxy programs iptables: it runs on the Debian root (iptables-nft by default).
  on_root "$k/kube-proxy:$K8S_VERSION" 'COPY kube-proxy /usr/local/bin/kube-proxy' "$TOOLS/kube-proxy"
  on_root "$FLANNEL_IMAGE" 'COPY flanneld /opt/bin/flanneld
COPY cni /opt/cni-plugins
ENTRYPOINT ["/opt/bin/flanneld"]' "$TOOLS/flanneld" "$TOOLS/cni"
}

# The node: the Debian root with kind's layout, the Kubernetes binaries, and the images
# above saved into /kind/images, which modelpool-preload.service imports into containerd
# before the kubelet starts (kind runs kubeadm only once the node is up).
build_node() {
  have "$NODE_IMAGE" && return 0
  local start=$SECONDS
  local dir="$WORK/node"
  rm -rf "$dir" && mkdir -p "$dir/images" "$dir/cni"
  cp "$TOOLS/kubelet" "$TOOLS/kubeadm" "$CONTROL_PLANE/kubectl" "$TOOLS/crictl" "$dir/"
  cp "$TOOLS/cni/"* "$dir/cni/"
  cp "$here/node/modelpool-preload.service" "$here/node/modelpool-entrypoint" "$dir/"
  local k=registry.k8s.io image
  for image in "$k/kube-apiserver:$K8S_VERSION" "$k/kube-controller-manager:$K8S_VERSION" \
      "$k/kube-scheduler:$K8S_VERSION" "$k/kube-proxy:$K8S_VERSION" "$k/etcd:3.6.6-0" \
      "$k/pause:3.10.1" "$k/pause:3.10" "$k/coredns/coredns:$COREDNS_VERSION" "$FLANNEL_IMAGE"; do
    docker save "$image" -o "$dir/images/$(echo "$image" | tr '/:' '__').tar"
  done
  cat >"$dir/Dockerfile" <<EOF
FROM $ROOT_IMAGE
COPY kubelet kubeadm kubectl /usr/bin/
COPY crictl /usr/local/bin/
COPY cni/ /opt/cni/bin/
COPY images/ /kind/images/
COPY modelpool-preload.service /etc/systemd/system/
COPY modelpool-entrypoint /usr/local/bin/
RUN echo -n "$K8S_VERSION" > /kind/version && systemctl enable modelpool-preload.service
ENV container=docker
STOPSIGNAL SIGRTMIN+3
ENTRYPOINT ["/usr/local/bin/modelpool-entrypoint", "/usr/local/bin/entrypoint", "/sbin/init"]
EOF
  DOCKER_BUILDKIT=0 docker build -q -t "$NODE_IMAGE" "$dir" >/dev/null 2>&1 || {
    DOCKER_BUILDKIT=0 docker build -t "$NODE_IMAGE" "$dir" >&2; exit 1; }
  rm -rf "$dir"
  log "$NODE_IMAGE: done in $((SECONDS - start))s"
}

# The node with another containerd in /usr/local/bin, where kind's containerd.service and
# PATH find it before Debian's. containerd 2.x reads kind's version 2 config as it is and
# injects CDI devices by default.
build_node_containerd() {
  local version="$1" image="$NODE_IMAGE-containerd-$1"
  have "$image" && { echo "$image"; return 0; }
  local start=$SECONDS bin dir="$WORK/node-containerd"
  bin="$(bash "$here/build-containerd.sh" "$version" | tail -n 1)"
  rm -rf "$dir" && mkdir -p "$dir"
  cp "$bin/containerd" "$bin/ctr" "$bin/containerd-shim-runc-v2" "$dir/"
  cat >"$dir/Dockerfile" <<EOF
FROM $NODE_IMAGE
RUN rm -f /usr/local/bin/containerd /usr/local/bin/ctr /usr/local/bin/containerd-shim-runc-v2
COPY containerd ctr containerd-shim-runc-v2 /usr/local/bin/
EOF
  DOCKER_BUILDKIT=0 docker build -q -t "$image" "$dir" >/dev/null 2>&1 || {
    DOCKER_BUILDKIT=0 docker build -t "$image" "$dir" >&2; exit 1; }
  rm -rf "$dir"
  log "$image: done in $((SECONDS - start))s"
  echo "$image"
}

have "$ROOT_IMAGE" || build_root
if [[ ${1:-} == --root ]]; then  # the Debian root alone (the offline Python base)
  echo "$ROOT_IMAGE"
  exit 0
fi
build_components
build_node
if [[ -n ${MODELPOOL_KIND_CONTAINERD:-} ]]; then
  build_node_containerd "$MODELPOOL_KIND_CONTAINERD"
else
  echo "$NODE_IMAGE"
fi
