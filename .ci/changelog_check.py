#!/usr/bin/env python3
"""Fails when a commit changes what a vendor sees without a CHANGELOG.md line.

What a vendor sees is recorded in checked-in files that CI keeps true:
  <crate>/public-api.txt           the public API of ccm-core, ccm-controllers, ccm-testing
                                   (.ci/public_api.py fails when it is stale)
  ccm-testing/harness-defaults.txt the harness's defaults (its test fails when it is stale)
  Cargo.toml                       the workspace version, only when the version line changes

Every non-merge commit after the release in .ci/semver-baseline that changes one of these files
must add a line to CHANGELOG.md in the same commit, or say why none is needed with a trailer in
its message: `Changelog: none (<reason>)`. The check is this simple on purpose: it cannot tell
whether the line says the right thing (a reviewer reads that), only that nobody forgot.

  .ci/changelog_check.py            check the commits since the baseline
  .ci/changelog_check.py REV        check the commits since REV instead
"""
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
WATCHED = [
    "ccm-core/public-api.txt",
    "ccm-controllers/public-api.txt",
    "ccm-testing/public-api.txt",
    "ccm-testing/harness-defaults.txt",
]
TRAILER = re.compile(r"^Changelog: none \(.+\)\s*$", re.MULTILINE)


def git(*args):
    return subprocess.run(["git", *args], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout


def baseline():
    for line in (ROOT / ".ci" / "semver-baseline").read_text().splitlines():
        if line.startswith("commit "):
            return line.split()[1]
    sys.exit(".ci/semver-baseline names no commit")


def changelog_lines_added(commit):
    diff = git("show", "--format=", "--unified=0", commit, "--", "CHANGELOG.md")
    return [l for l in diff.splitlines()
            if l.startswith("+") and not l.startswith("+++") and l[1:].strip()]


def version_changed(commit):
    diff = git("show", "--format=", "--unified=0", commit, "--", "Cargo.toml")
    return any(re.match(r"^[+-]version = ", l) for l in diff.splitlines())


def main():
    since = sys.argv[1] if len(sys.argv) > 1 else baseline()
    try:
        git("cat-file", "-e", f"{since}^{{commit}}")
    except subprocess.CalledProcessError:
        sys.exit(f"changelog check: commit {since} is not in this clone (a shallow clone? "
                 "fetch the history: git fetch --unshallow)")
    commits = git("rev-list", "--no-merges", "--reverse", f"{since}..HEAD").split()
    failures = []
    for commit in commits:
        files = set(git("show", "--format=", "--name-only", commit).split())
        touched = [f for f in WATCHED if f in files]
        if "Cargo.toml" in files and version_changed(commit):
            touched.append("Cargo.toml (version)")
        if not touched:
            continue
        message = git("show", "-s", "--format=%B", commit)
        if changelog_lines_added(commit) or TRAILER.search(message):
            continue
        subject = message.splitlines()[0] if message else ""
        failures.append(f"{commit[:10]} {subject[:70]}\n    changes {', '.join(touched)}")
    print(f"changelog check: {len(commits)} commits since {since[:10]}, "
          f"{len(failures)} without a CHANGELOG.md line")
    if failures:
        print("These commits change what a vendor sees but add no CHANGELOG.md line:")
        for f in failures:
            print("  " + f)
        print("Add the line in the same commit (git commit --amend, or git rebase -i), or put "
              "'Changelog: none (<reason>)' in the commit message.")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
