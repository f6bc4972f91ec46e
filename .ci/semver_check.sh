#!/usr/bin/env bash
# cargo semver-checks on ccm-core, ccm-controllers and ccm-testing against the release named in
# .ci/semver-baseline (or the commit given as $1).
#
# cargo-semver-checks can build both sides itself (--baseline-rev), but it then compiles every
# dependency twice per crate in a target directory of its own: six builds of kube and
# k8s-openapi, 15 min and several GB on a 2-core machine. Here both sides' rustdoc JSON is built
# with cargo (the baseline in a temporary git worktree) in one shared target directory, where the
# dependencies are compiled once, and semver-checks only compares the JSON files.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
target="${CARGO_TARGET_DIR:-$root/target}"
baseline=${1:-$(awk '$1 == "commit" { print $2 }' .ci/semver-baseline)}
crates=(ccm-core ccm-controllers ccm-testing)

if ! git cat-file -e "$baseline^{commit}" 2>/dev/null; then
    echo "the semver baseline $baseline is not in this clone (shallow?): fetch the history" >&2
    exit 1
fi

work=$(mktemp -d)
cleanup() {
    git worktree remove --force "$work/baseline" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

# rustdoc's JSON is unstable output; RUSTC_BOOTSTRAP=1 lets stable produce it (semver-checks
# does the same). A library leaves the Kubernetes version to the binary: the env var picks one.
rustdoc_json() { # <source dir> <crate> <out dir>
    (
        cd "$1"
        RUSTC_BOOTSTRAP=1 K8S_OPENAPI_ENABLED_VERSION=1.33 CARGO_TARGET_DIR="$target" \
            cargo rustdoc -q -p "$2" --lib -- -Z unstable-options --output-format json
    )
    cp "$target/doc/${2//-/_}.json" "$3/"
}

mkdir -p "$work/current" "$work/base"
git worktree add --quiet --detach "$work/baseline" "$baseline"
for crate in "${crates[@]}"; do
    rustdoc_json "$work/baseline" "$crate" "$work/base"
    rustdoc_json "$root" "$crate" "$work/current"
done

status=0
for crate in "${crates[@]}"; do
    json="${crate//-/_}.json"
    echo "-- $crate"
    cargo semver-checks check-release \
        --baseline-rustdoc "$work/base/$json" --current-rustdoc "$work/current/$json" || status=1
done
if [ "$status" -ne 0 ]; then
    echo "A breaking change needs a version bump (0.x.y -> 0.(x+1).0 in the workspace Cargo.toml)" \
        "and a CHANGELOG.md line saying what a vendor has to do." >&2
fi
exit "$status"
