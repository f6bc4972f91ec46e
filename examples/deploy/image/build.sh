#!/usr/bin/env bash
# Builds the container image of a cloud-controller-manager binary made with ccm-rs, from the
# Containerfile beside this script, with nothing from a container registry (FROM scratch).
#
#   examples/deploy/image/build.sh [--manifest-path Cargo.toml] [--package NAME] [--bin NAME]
#                                  [--tag IMAGE] [--version VERSION]
#
# Defaults: the workspace's Cargo.toml, package and binary fake-ccm, tag
# localhost/<bin>:<version>, version from `cargo metadata`. For aws-ccm:
#   examples/deploy/image/build.sh --manifest-path examples/aws-ccm/Cargo.toml --package aws-ccm
# A vendor's crate: --manifest-path path/to/your/Cargo.toml --package your-ccm.
#
# Two steps, as an offline multi-stage build is not possible (the build stage would need a Rust
# image from a registry):
# 1. the binary: `cargo auditable build --release`, statically linked against glibc
#    (`-C target-feature=+crt-static`; glibc >= 2.34 has the "files" and "dns" name services
#    inside libc, so host names resolve in a scratch image with no shared library; checked
#    by .ci/image_check.sh), its dependency list embedded for scanners (cargo auditable, read
#    by `syft`, `trivy`, `grype`, `cargo audit bin`);
# 2. the image: `buildah bud` of the Containerfile over a context holding the binary, the
#    user 65532, nsswitch.conf and the CA bundle of this machine (Debian's ca-certificates).
#
# Needs: cargo-auditable (`cargo install cargo-auditable --locked`), buildah (Debian:
# `apt-get install buildah`; it runs as root or rootless, with no daemon; STORAGE_DRIVER=vfs
# where overlay mounts are not allowed, as in CI), and /etc/ssl/certs/ca-certificates.crt.
# Push with `buildah push IMAGE docker://registry.example.com/...` (docs/running.md).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
manifest=Cargo.toml
package=fake-ccm
bin=""
tag=""
version=""
while [ $# -gt 0 ]; do
    case "$1" in
        --manifest-path) manifest=$2; shift 2 ;;
        --package) package=$2; shift 2 ;;
        --bin) bin=$2; shift 2 ;;
        --tag) tag=$2; shift 2 ;;
        --version) version=$2; shift 2 ;;
        -h|--help) sed -n '2,27p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "build.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
done
bin=${bin:-$package}

for tool in buildah readelf strip; do
    if ! command -v "$tool" >/dev/null; then
        echo "build.sh: '$tool' is not installed (Debian: apt-get install buildah binutils)" >&2
        exit 1
    fi
done
if ! cargo auditable --version >/dev/null 2>&1; then
    echo "build.sh: cargo-auditable is not installed: cargo install cargo-auditable --locked" >&2
    exit 1
fi
ca_bundle=/etc/ssl/certs/ca-certificates.crt
if [ ! -s "$ca_bundle" ]; then
    echo "build.sh: no CA bundle at $ca_bundle (Debian: apt-get install ca-certificates)" >&2
    exit 1
fi

if [ -z "$version" ]; then
    version=$(cargo metadata --manifest-path "$manifest" --format-version 1 --no-deps |
        python3 -c 'import json,sys; p=[p for p in json.load(sys.stdin)["packages"] if p["name"]==sys.argv[1]]; print(p[0]["version"] if p else "")' "$package")
    if [ -z "$version" ]; then
        echo "build.sh: no package '$package' in $manifest" >&2
        exit 1
    fi
fi
tag=${tag:-localhost/$bin:$version}

# 1. The binary. An explicit --target keeps build scripts and proc macros dynamic (they run on
# the build machine) while the binary is static.
host=$(rustc -vV | sed -n 's/^host: //p')
case "$host" in
    *-linux-gnu) ;;
    *) echo "build.sh: a static glibc build needs a *-linux-gnu host, not $host" >&2; exit 1 ;;
esac
target_dir=$(cargo metadata --manifest-path "$manifest" --format-version 1 --no-deps |
    python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])')
started=$(date +%s)
RUSTFLAGS="${RUSTFLAGS:-} -C target-feature=+crt-static" \
    cargo auditable build --release --locked --manifest-path "$manifest" \
    --package "$package" --bin "$bin" --target "$host"
binary="$target_dir/$host/release/$bin"
echo "build.sh: binary built in $(($(date +%s) - started)) s: $binary"
if readelf -d "$binary" | grep -q '(NEEDED)'; then
    echo "build.sh: $binary needs shared libraries; a scratch image cannot run it:" >&2
    readelf -d "$binary" | grep '(NEEDED)' >&2
    exit 1
fi
if ! readelf -S "$binary" | grep -q '\.dep-v0'; then
    echo "build.sh: $binary has no embedded dependency list (.dep-v0 section)" >&2
    exit 1
fi

# 2. The build context.
context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
rootfs=$context/rootfs
# Without its line tables (the release profile keeps them for backtraces on the build machine):
# 120 MB -> 25 MB for fake-ccm. The symbols stay, so a panic's backtrace still names functions,
# and so does the embedded dependency list.
install -d -m 0755 "$rootfs/usr/local/bin"
strip --strip-debug -o "$rootfs/usr/local/bin/cloud-controller-manager" "$binary"
chmod 0755 "$rootfs/usr/local/bin/cloud-controller-manager"
install -D -m 0644 "$ca_bundle" "$rootfs/etc/ssl/certs/ca-certificates.crt"
install -d -m 0755 "$rootfs/etc"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin\n' \
    >"$rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$rootfs/etc/group"
printf 'hosts: files dns\n' >"$rootfs/etc/nsswitch.conf"
cp "$here/Containerfile" "$context/Containerfile"

revision=$(git -C "$(dirname "$manifest")" rev-parse HEAD 2>/dev/null || echo unknown)
source_url=$(git -C "$(dirname "$manifest")" config --get remote.origin.url 2>/dev/null || true)
labels=(
    --label "org.opencontainers.image.version=$version"
    --label "org.opencontainers.image.revision=$revision"
    --label "org.opencontainers.image.created=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
    --label "org.opencontainers.image.ref.name=$bin"
)
if [ -n "$source_url" ]; then
    labels+=(--label "org.opencontainers.image.source=$source_url")
fi
buildah bud --quiet --layers=false "${labels[@]}" -f "$context/Containerfile" -t "$tag" "$context"
echo "build.sh: image $tag"
buildah images --format '{{.Name}}:{{.Tag}} {{.Size}}' "$tag"
