#!/usr/bin/env bash
# The Kubernetes versions other than the oldest (docs/kubernetes-versions.md): k8s-openapi
# compiles for the one version its `v1_*` feature names, and the crates name `v1_33` (their
# dev-dependencies, the example binaries), the oldest supported. Every other step of CI builds
# and tests that one. Here, for each other version, a copy of the checkout (its tracked files,
# as they are in the work tree) has that feature in place of `v1_33` in every Cargo.toml, and:
#
#   versions between the oldest and the newest: `cargo check` of ccm-core, ccm-controllers and
#   ccm-testing, libraries and tests (every type and field our code and tests touch);
#   the newest: the same check, then the controller tests (`cargo test -p ccm-controllers`).
#
# The copy builds in this checkout's target directory: the feature is part of k8s-openapi's
# artifact hash, so each version's k8s-openapi, kube and our crates sit beside the 1.33 ones
# (nothing rebuilt when switching back, later runs incremental) and every dependency below kube
# is reused. Usage: .ci/k8s_versions.sh [CHECKED... TESTED] (default: 1.34 1.35 1.36 1.37).
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$root/target}"
# The copies are built once and thrown away: no incremental caches for them (GBs on disk; each
# copy has a new path, so a cache would never be reused).
export CARGO_INCREMENTAL=0
versions=("$@")
if [ ${#versions[@]} -eq 0 ]; then
    versions=(1.34 1.35 1.36 1.37)
fi
newest=${versions[${#versions[@]} - 1]}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

for version in "${versions[@]}"; do
    feature="v${version/./_}"
    copy="$work/$feature"
    mkdir -p "$copy"
    git ls-files -z | xargs -0 cp --parents -t "$copy"
    # The three crates built here name the version in their dev-dependencies, docs.rs metadata
    # and the ccm-apiserver feature; nothing else of the copy is built (the vendor template, a
    # copy of the guide, keeps its text).
    for manifest in ccm-core ccm-controllers ccm-testing; do
        sed -i "s/v1_33/$feature/g" "$copy/$manifest/Cargo.toml"
        grep -q "$feature" "$copy/$manifest/Cargo.toml"
    done
    (
        cd "$copy"
        started=$SECONDS
        echo "-- Kubernetes $version ($feature): cargo check"
        cargo check -q -p ccm-core -p ccm-controllers -p ccm-testing --tests
        echo "-- Kubernetes $version: checked in $((SECONDS - started)) s"
        if [ "$version" = "$newest" ]; then
            started=$SECONDS
            echo "-- Kubernetes $version ($feature): the controller tests"
            cargo test -p ccm-controllers --tests
            echo "-- Kubernetes $version: tests built and run in $((SECONDS - started)) s"
        fi
    )
    rm -rf "$copy"
done
