#!/usr/bin/env bash
# cargo semver-checks on ccm-core, ccm-controllers and ccm-testing against the release named in
# .ci/semver-baseline (or the commit given as $1).
#
# cargo-semver-checks can build both sides itself (--baseline-rev), but it then compiles every
# dependency twice per crate in a target directory of its own: six builds of kube and
# k8s-openapi, 15 min and several GB on a 2-core machine. Here both sides' rustdoc JSON is built
# with cargo (the baseline in a temporary git worktree) in one shared target directory, where the
# dependencies are compiled once, and semver-checks only compares the JSON files.
#
# After a breaking bump (0.x -> 0.(x+1), or x -> x+1) semver-checks allows every change and
# checks nothing, so the release would pass without a word about what broke: the script then
# lists the breaking changes too (the same comparison as for a minor release), for the
# CHANGELOG's migration section. The list does not fail the check; the version bump allows it.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
target="${CARGO_TARGET_DIR:-$root/target}"
baseline=${1:-$(awk '$1 == "commit" { print $2 }' .ci/semver-baseline)}
crates=(ccm-core ccm-controllers ccm-testing)

# The workspace version in a Cargo.toml read on stdin.
workspace_version() {
    # Reads to the end (no early `exit`): `git show | ...` must not die of SIGPIPE (pipefail).
    awk -F'"' '/^\[/ { section = $0 } section == "[workspace.package]" && /^version *=/ && !found { print $2; found = 1 }'
}
# Whether version $2 is a breaking release after $1 as Cargo reads versions.
breaking_bump() {
    local a1 b1 a2 b2
    IFS=. read -r a1 b1 _ <<<"$1"
    IFS=. read -r a2 b2 _ <<<"$2"
    [ "$a1" != "$a2" ] || { [ "$a1" = 0 ] && [ "$b1" != "$b2" ]; }
}

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
done
# Both sides' crates get the same artifact names (cargo's metadata hash of a workspace member
# leaves out its path), and cargo judges them fresh by mtime: current sources older than the
# baseline's artifacts (a checkout made before the baseline build) would be documented against
# the baseline's ccm-core. Newer sources make cargo rebuild them.
find "${crates[@]}" -name '*.rs' -exec touch {} +
for crate in "${crates[@]}"; do
    rustdoc_json "$root" "$crate" "$work/current"
done

base_version=$(git show "$baseline:Cargo.toml" | workspace_version)
current_version=$(workspace_version <Cargo.toml)
if [ -z "$base_version" ] || [ -z "$current_version" ]; then
    echo "no [workspace.package] version in Cargo.toml (baseline: '$base_version', now: '$current_version')" >&2
    exit 1
fi

status=0
for crate in "${crates[@]}"; do
    json="${crate//-/_}.json"
    echo "-- $crate"
    cargo semver-checks check-release \
        --baseline-rustdoc "$work/base/$json" --current-rustdoc "$work/current/$json" || status=1
done
if [ "$status" -eq 0 ] && breaking_bump "$base_version" "$current_version"; then
    echo "-- breaking changes since $base_version, allowed by the bump to $current_version" \
        "(each must be in CHANGELOG.md's migration section)"
    for crate in "${crates[@]}"; do
        json="${crate//-/_}.json"
        echo "-- $crate"
        # Exits 1 when it finds a breaking change, which the bump allows.
        cargo semver-checks check-release --release-type minor \
            --baseline-rustdoc "$work/base/$json" --current-rustdoc "$work/current/$json" || true
    done
fi
if [ "$status" -ne 0 ]; then
    echo "A breaking change needs a version bump (0.x.y -> 0.(x+1).0 in the workspace Cargo.toml)" \
        "and a CHANGELOG.md line saying what a vendor has to do." >&2
fi
exit "$status"
