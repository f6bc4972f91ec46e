#!/usr/bin/env python3
"""Lists the public API of each published crate (ccm-core, ccm-controllers, ccm-testing) from
rustdoc's JSON and diffs it against the checked-in <crate>/public-api.txt, so that a change to
what vendors can name is a reviewed change to that file (and, through .ci/changelog_check.py,
comes with a CHANGELOG line).

  .ci/public_api.py          check (exit 1 and print the diff when an API changed)
  .ci/public_api.py --bless  rewrite the <crate>/public-api.txt files

cargo-semver-checks (in .ci/run) decides whether a change is breaking; this listing is the
readable record of what a vendor can name, one line per item, which a reviewer reads in a diff
and the changelog check keys on. It does not show signatures: semver-checks covers those.

rustdoc's JSON output is unstable; RUSTC_BOOTSTRAP=1 lets the stable toolchain produce it.
The list names each public item once, at the path a vendor writes (`ccm_controllers::Builder`),
with its kind, plus the public fields, variants and inherent methods of public types.
"""
import difflib
import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
CRATES = ["ccm-core", "ccm-controllers", "ccm-testing"]


def rustdoc_json(crate):
    env = dict(os.environ)
    env["RUSTC_BOOTSTRAP"] = "1"
    env.setdefault("K8S_OPENAPI_ENABLED_VERSION", "1.33")
    subprocess.run(
        ["cargo", "rustdoc", "-q", "-p", crate, "--lib", "--",
         "-Z", "unstable-options", "--output-format", "json"],
        check=True, cwd=ROOT, env=env)
    target = pathlib.Path(env.get("CARGO_TARGET_DIR", ROOT / "target"))
    if not target.is_absolute():
        target = ROOT / target
    with open(target / "doc" / (crate.replace("-", "_") + ".json")) as f:
        return json.load(f)


def kind_of(item):
    inner = item.get("inner", {})
    if isinstance(inner, dict) and inner:
        return next(iter(inner))
    return str(inner)


def list_api(doc):
    index = doc["index"]
    crate_id = index[str(doc["root"])]["crate_id"]
    lines = set()
    seen = set()

    def get(item_id):
        return index.get(str(item_id))

    def members(path, item):
        inner = item["inner"]
        kind = kind_of(item)
        body = inner[kind]
        if kind == "struct":
            fields = body.get("kind", {})
            plain = fields.get("plain", {}) if isinstance(fields, dict) else {}
            for fid in plain.get("fields", []) or []:
                f = get(fid)
                if f and f.get("visibility") == "public":
                    lines.add(f"{path}::{f['name']} (field)")
        if kind == "enum":
            for vid in body.get("variants", []) or []:
                v = get(vid)
                if v:
                    lines.add(f"{path}::{v['name']} (variant)")
        for iid in body.get("impls", []) or []:
            imp = get(iid)
            if not imp:
                continue
            ib = imp["inner"].get("impl", {})
            if ib.get("trait") is not None or ib.get("blanket_impl") is not None:
                continue
            for mid in ib.get("items", []) or []:
                m = get(mid)
                if m and m.get("visibility") == "public" and m.get("crate_id") == crate_id:
                    lines.add(f"{path}::{m['name']} ({kind_of(m)})")

    def visit(path, item_id, name=None):
        item = get(item_id)
        if item is None:
            # An item of another crate re-exported here.
            if name:
                lines.add(f"{path}::{name} (re-export)")
            return
        if item.get("crate_id") != crate_id:
            lines.add(f"{path}::{name or item.get('name')} (re-export)")
            return
        kind = kind_of(item)
        if kind == "use":
            use = item["inner"]["use"]
            target = use.get("id")
            if use.get("is_glob"):
                target_item = get(target) if target is not None else None
                if target_item and kind_of(target_item) == "module":
                    for child in target_item["inner"]["module"]["items"]:
                        c = get(child)
                        if c and c.get("visibility") == "public":
                            visit(path, child)
                return
            if target is None:
                lines.add(f"{path}::{use['name']} (re-export)")
                return
            visit(path, target, use["name"])
            return
        own = name or item.get("name")
        full = f"{path}::{own}" if path else own
        if (full, item_id) in seen:
            return
        seen.add((full, item_id))
        if kind == "module":
            if path:
                lines.add(f"{full} (module)")
            for child in item["inner"]["module"]["items"]:
                c = get(child)
                if c and c.get("visibility") == "public":
                    visit(full, child)
            return
        if kind in ("impl",):
            return
        marks = " #[non_exhaustive]" if "non_exhaustive" in item.get("attrs", []) else ""
        lines.add(f"{full} ({kind}){marks}")
        if kind in ("struct", "enum", "union"):
            members(full, item)

    visit("", doc["root"], None)
    return sorted(lines)


def check(crate, bless):
    snapshot = ROOT / crate / "public-api.txt"
    api = list_api(rustdoc_json(crate))
    text = "".join(line + "\n" for line in api)
    if bless:
        snapshot.write_text(text)
        print(f"wrote {snapshot.relative_to(ROOT)} ({len(api)} items)")
        return True
    old = snapshot.read_text() if snapshot.exists() else ""
    if old == text:
        print(f"public API of {crate} unchanged ({len(api)} items)")
        return True
    sys.stdout.writelines(difflib.unified_diff(
        old.splitlines(keepends=True), text.splitlines(keepends=True),
        f"{crate}/public-api.txt", "current"))
    print(f"\nThe public API of {crate} changed. If that is intended, run "
          f".ci/public_api.py --bless, commit {crate}/public-api.txt and add a CHANGELOG.md line.")
    return False


def main():
    bless = "--bless" in sys.argv
    ok = [check(crate, bless) for crate in CRATES]
    return 0 if all(ok) else 1


if __name__ == "__main__":
    sys.exit(main())
