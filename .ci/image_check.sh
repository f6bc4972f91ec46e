#!/usr/bin/env bash
# Issue 46: builds the fake-ccm image with the vendor's one command (examples/deploy/image/
# build.sh: buildah, vfs storage, no daemon, nothing from a registry) and checks it the way a
# cluster runs it: the image's root file system, read-only, as user 65532, with the files a
# kubelet would mount (/etc/hosts, the kubeconfig, the cloud-config) laid over it, starts the
# binary against the in-process ccm-apiserver reached by a host name, and a Node is
# initialised. `chroot --userspec` stands in for a container runtime (none can set limits in
# this sandbox); a read-only overlay mount (the image root plus a layer of mounted files, no
# upper directory) stands in for readOnlyRootFilesystem and the volumes.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
target="${CARGO_TARGET_DIR:-$root/target}"
export STORAGE_DRIVER=vfs
image=localhost/fake-ccm:ci-check

started=$(date +%s)
examples/deploy/image/build.sh --package fake-ccm --tag "$image"
echo "image built in $(($(date +%s) - started)) s (binary and image)"

work=$(mktemp -d)
container=""
apiserver=""
ccm=""
secure_port=""
cleanup() {
    status=$?
    if [ -n "$ccm" ]; then
        pid=$(ccm_pid_of "$secure_port")
        [ -n "$pid" ] && kill "$pid" 2>/dev/null
        kill "$ccm" 2>/dev/null || true
        wait "$ccm" 2>/dev/null || true
    fi
    if [ -n "$apiserver" ]; then
        kill "$apiserver" 2>/dev/null || true
        wait "$apiserver" 2>/dev/null || true
    fi
    if [ -n "$container" ]; then
        buildah umount "$container" >/dev/null 2>&1 || true
        buildah rm "$container" >/dev/null 2>&1 || true
    fi
    buildah rmi "$image" >/dev/null 2>&1 || true
    rm -rf "$work"
    exit "$status"
}
trap cleanup EXIT
# The pid of the CCM started from the image (found by its unique --secure-port argument; /proc
# rather than pgrep, which a minimal machine may lack).
ccm_pid_of() {
    local cmdline
    for cmdline in /proc/[0-9]*/cmdline; do
        if tr '\0' ' ' <"$cmdline" 2>/dev/null | grep -q -- "--secure-port=$1 "; then
            basename "$(dirname "$cmdline")"
            return
        fi
    done
}

container=$(buildah from "$image")
image_root=$(buildah mount "$container")

# What is in the image.
echo "-- image $image"
buildah images --format '{{.Name}}:{{.Tag}} {{.Size}}' "$image"
echo "image root file system: $(du -sb "$image_root" | cut -f1) bytes"
(cd "$image_root" && find . -type f -printf '%10s  %p\n' | sort -k2)
fail() { echo "image check: $*" >&2; exit 1; }
config=$(buildah inspect --type image --format '{{.OCIv1.Config.User}} {{index .OCIv1.Config.Entrypoint 0}}' "$image")
[ "$config" = "65532:65532 /usr/local/bin/cloud-controller-manager" ] ||
    fail "user and entrypoint are '$config'"
for label in title description licenses version revision created; do
    buildah inspect --type image --format "{{.OCIv1.Config.Labels}}" "$image" |
        grep -q "org.opencontainers.image.$label:" || fail "no org.opencontainers.image.$label label"
done
for shell in bin/sh bin/bash usr/bin/sh; do
    [ ! -e "$image_root/$shell" ] || fail "the image has a shell: /$shell"
done
binary=$image_root/usr/local/bin/cloud-controller-manager
! readelf -d "$binary" | grep -q '(NEEDED)' || fail "the binary needs shared libraries"
readelf -S "$binary" | grep -q '\.dep-v0' || fail "no embedded dependency list (cargo auditable)"
echo "binary: $(stat -c %s "$binary") bytes, static, dependency list embedded"

# The manifests run the image as it expects: its user and group, a read-only root, no
# capabilities.
for manifest in examples/deploy/deployment.yaml examples/deploy/shadow/deployment.yaml; do
    for setting in 'runAsNonRoot: true' 'runAsUser: 65532' 'runAsGroup: 65532' \
        'readOnlyRootFilesystem: true' 'allowPrivilegeEscalation: false' 'drop: \["ALL"\]'; do
        grep -Eq "^ +$setting\$" "$manifest" || fail "$manifest does not set $setting"
    done
done

# The files a kubelet would mount: /etc/hosts naming the API server, the kubeconfig, the
# cloud-config; laid over the image root in a read-only overlay.
cargo build -p ccm-testing --features ccm-apiserver --bin ccm-apiserver
node=image-check-$(date +%s)
"$target/debug/ccm-apiserver" --port 0 --kubeconfig "$work/kubeconfig" --node "$node" \
    >"$work/apiserver.log" 2>&1 &
apiserver=$!
for _ in $(seq 1 100); do
    [ -s "$work/kubeconfig" ] && break
    sleep 0.1
done
[ -s "$work/kubeconfig" ] || { cat "$work/apiserver.log"; fail "ccm-apiserver did not start"; }
port=$(sed -n 's#.*server: *http://127.0.0.1:\([0-9]*\).*#\1#p' "$work/kubeconfig")
[ -n "$port" ] || fail "no port in $work/kubeconfig"
hostname=ccm-apiserver.image-check.test
mounts=$work/mounts
install -d "$mounts/etc/kubernetes/cloud-config" "$mounts/dev" "$work/merged"
# The device nodes every container runtime provides (runc's defaults); the binary reads
# /dev/urandom where the getrandom system call cannot be found from a static binary.
devices="null zero random urandom"
for device in $devices; do
    : >"$mounts/dev/$device"
done
printf '127.0.0.1 localhost\n127.0.0.1 %s\n' "$hostname" >"$mounts/etc/hosts"
sed "s#http://127.0.0.1:$port#http://$hostname:$port#" "$work/kubeconfig" >"$mounts/etc/kubernetes/kubeconfig"
grep -q "http://$hostname:$port" "$mounts/etc/kubernetes/kubeconfig" || fail "kubeconfig not rewritten"
printf 'latency_ms: 0\nzone: zone-a\nregion: region-1\ninstance_type: fake-small\n' \
    >"$mounts/etc/kubernetes/cloud-config/cloud.conf"
chmod -R a+rX "$mounts"
secure_port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')

# Runs the image's binary with ARGS as user 65532 on the read-only root (in a mount namespace
# of its own, so the overlay goes with the process).
run_in_image() {
    unshare --mount --propagation private sh -c '
        mount -t overlay image-check -o "lowerdir=$1:$2" "$3" || exit 97
        for device in $DEVICES; do
            mount --bind "/dev/$device" "$3/dev/$device" || exit 97
        done
        shift 3
        exec chroot --userspec=65532:65532 "$MERGED" /usr/local/bin/cloud-controller-manager "$@"
    ' run_in_image "$mounts" "$image_root" "$work/merged" "$@"
}
export MERGED=$work/merged DEVICES="$devices"

echo "-- --version, --help, as user 65532 on a read-only root"
run_in_image --version
run_in_image --help >"$work/help.txt"
grep -q -- '--cloud-provider' "$work/help.txt" || fail "--help does not list --cloud-provider"
echo "--help: $(wc -l <"$work/help.txt") lines"

echo "-- the binary initialises a Node against ccm-apiserver at http://$hostname:$port"
run_in_image --kubeconfig /etc/kubernetes/kubeconfig --cloud-provider=fake \
    --cloud-config=/etc/kubernetes/cloud-config/cloud.conf --leader-elect=false \
    --bind-address=127.0.0.1 --secure-port="$secure_port" --controllers=cloud-node \
    >"$work/ccm.log" 2>&1 &
ccm=$!
kubectl_() { kubectl --kubeconfig "$work/kubeconfig" "$@"; }
provider_id=""
for _ in $(seq 1 120); do
    provider_id=$(kubectl_ get node "$node" -o jsonpath='{.spec.providerID}' 2>/dev/null || true)
    taints=$(kubectl_ get node "$node" -o jsonpath='{.spec.taints}' 2>/dev/null || true)
    if [ -n "$provider_id" ] && ! grep -q uninitialized <<<"$taints"; then
        break
    fi
    provider_id=""
    sleep 0.5
done
ccm_pid=$(ccm_pid_of "$secure_port")
ccm_uid=$(awk '/^Uid:/ { print $2 }' "/proc/$ccm_pid/status" 2>/dev/null || true)
if [ -z "$provider_id" ]; then
    echo "-- CCM log"; cat "$work/ccm.log"
    fail "Node $node was not initialised within 60 s"
fi
echo "Node $node initialised: providerID $provider_id, labels:"
kubectl_ get node "$node" -o jsonpath='{.metadata.labels}'; echo
python3 - "$secure_port" <<'PY' || fail "/healthz not served"
import ssl, sys, urllib.request
context = ssl.create_default_context()
context.check_hostname = False
context.verify_mode = ssl.CERT_NONE  # the CCM's self-signed serving certificate
with urllib.request.urlopen(f"https://127.0.0.1:{sys.argv[1]}/healthz", context=context, timeout=5) as answer:
    assert answer.status == 200 and answer.read() == b"ok", answer.status
PY
echo "/healthz served on 127.0.0.1:$secure_port; the process runs as uid ${ccm_uid:-?}"
[ "${ccm_uid:-}" = 65532 ] || fail "the CCM does not run as uid 65532 (uid '${ccm_uid:-}')"
echo "image check passed"
