//! Keeps the layout of `ARCHITECTURE.md` from rotting: reads `src/` and fails on an import that
//! points back up a layer or across controllers, on an import cycle between files (inside a
//! layer too), on I/O in a `plan.rs`, and on a runtime dependency of ccm-core.
//!
//! Layers, top to bottom (a file may import its own layer and the layers below it):
//! `lib.rs` → `runtime/` → `options/` → `controllers/<name>/` and `secure_serving/` →
//! `machinery/`. A controller imports only its own folder, the shared `controllers/node/`
//! (node controllers) and `machinery/`; `machinery/go_syntax.rs` imports nothing of the crate.

use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let entries = std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    for entry in entries {
        let path = entry.expect("dir entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The code of a file without comments (line comments, doc comments) and without its unit
/// tests (`#[cfg(test)] mod tests`, which may build objects with any crate's types); string
/// contents are kept: paths in strings do not occur in this crate.
fn code_lines(text: &str) -> impl Iterator<Item = (usize, &str)> {
    let text = text
        .find("\n#[cfg(test)]\nmod tests")
        .map_or(text, |end| &text[..end]);
    text.lines().enumerate().filter_map(|(i, line)| {
        let code = line.split("//").next().unwrap_or_default();
        (!code.trim().is_empty()).then_some((i + 1, code))
    })
}

/// Every crate path a line names, as its first two segments (`machinery::context`,
/// `controllers::node`, `options`), following `crate::{a, b::c}` groups one level deep.
fn crate_paths(code: &str, continued_group: &mut Option<String>) -> Vec<Vec<String>> {
    module_paths(code, "crate::", continued_group)
        .into_iter()
        .map(|path| {
            path.split("::")
                .filter(|s| !s.is_empty())
                .take(2)
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter(|segments| !segments.is_empty())
        .collect()
}

/// Imports that break the layering and are known, each with the reason; the list only shrinks.
/// `ClientFactory` (per-controller clients, merged from main while the layout moved) lives in
/// the runtime's client module, which reads the options; the context hands it to controllers.
/// Moving the factory under `machinery/` without its options reader removes this entry.
const KNOWN_EXCEPTIONS: &[(&str, &str)] = &[("machinery/context.rs", "runtime::client")];

/// Which crate paths a file in `src/<relative>` may name.
fn allowed(relative: &str, path: &[String]) -> bool {
    if KNOWN_EXCEPTIONS
        .iter()
        .any(|(file, target)| relative == *file && path.join("::") == *target)
    {
        return true;
    }
    let first = path[0].as_str();
    let second = path.get(1).map(String::as_str).unwrap_or_default();
    let top = relative.split('/').next().unwrap_or_default();
    match top {
        "lib.rs" => true,
        "runtime" => !first.is_empty() && first.chars().next().is_some_and(|c| c.is_lowercase()),
        "options" => matches!(first, "options" | "secure_serving" | "machinery"),
        "secure_serving" => matches!(first, "secure_serving" | "machinery"),
        "machinery" => {
            if relative == "machinery/go_syntax.rs" {
                first == "machinery" && second == "go_syntax"
            } else {
                first == "machinery"
            }
        }
        "controllers" => {
            let own = relative.split('/').nth(1).unwrap_or_default();
            let own = own.trim_end_matches(".rs");
            match first {
                "machinery" => true,
                "controllers" => second == own || (second == "node" && own != "mod"),
                _ => false,
            }
        }
        other => panic!("src/{other}: a top-level entry ARCHITECTURE.md does not name"),
    }
}

#[test]
fn imports_point_down_the_layers() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    assert!(
        files.len() > 20,
        "found only {} files under src/",
        files.len()
    );
    let mut violations = Vec::new();
    for file in &files {
        let relative = file
            .strip_prefix(&src)
            .expect("under src")
            .to_string_lossy()
            .replace('\\', "/");
        let text = std::fs::read_to_string(file).expect("read source");
        let mut group = None;
        for (line_no, code) in code_lines(&text) {
            for path in crate_paths(code, &mut group) {
                if path[0].chars().next().is_some_and(|c| c.is_uppercase()) && relative != "lib.rs"
                {
                    violations.push(format!(
                        "src/{relative}:{line_no}: crate::{} names a root re-export; import it \
                         from its module",
                        path.join("::")
                    ));
                } else if !allowed(&relative, &path) {
                    violations.push(format!(
                        "src/{relative}:{line_no}: crate::{} points up a layer or across controllers",
                        path.join("::")
                    ));
                }
            }
            if code.contains("super::super") {
                violations.push(format!(
                    "src/{relative}:{line_no}: super::super leaves the folder; use a crate:: path"
                ));
            }
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn plans_do_no_io() {
    let controllers = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/controllers");
    let mut files = Vec::new();
    rust_files(&controllers, &mut files);
    let plans: Vec<_> = files
        .iter()
        .filter(|f| f.file_name().is_some_and(|n| n == "plan.rs"))
        .collect();
    assert!(plans.len() >= 4, "expected a plan.rs per controller");
    let mut violations = Vec::new();
    for plan in plans {
        let text = std::fs::read_to_string(plan).expect("read plan.rs");
        for (line_no, code) in code_lines(&text) {
            for io in [
                ".await",
                "async ",
                "kube::",
                "Api<",
                "std::fs",
                "tokio::net",
                "tokio::spawn",
                "reqwest",
                "hyper",
            ] {
                if code.contains(io) {
                    violations.push(format!("{}:{line_no}: `{io}` in a plan", plan.display()));
                }
            }
        }
    }
    assert!(violations.is_empty(), "{}", violations.join("\n"));
}

#[test]
fn every_controller_folder_has_one_shape() {
    let controllers = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/controllers");
    for entry in std::fs::read_dir(&controllers).expect("read controllers/") {
        let dir = entry.expect("dir entry").path();
        if !dir.is_dir() || dir.file_name().is_some_and(|n| n == "node") {
            continue;
        }
        for file in ["mod.rs", "sync.rs", "plan.rs"] {
            assert!(dir.join(file).exists(), "{}: no {file}", dir.display());
        }
        let sync = std::fs::read_to_string(dir.join("sync.rs")).expect("read sync.rs");
        assert!(
            sync.contains("struct Reconciler"),
            "{}/sync.rs: the reconciler is named `Reconciler`",
            dir.display()
        );
        let module = std::fs::read_to_string(dir.join("mod.rs")).expect("read mod.rs");
        for item in [
            "pub const NAME: &str",
            "pub const ALIAS: &str",
            "pub fn validate(&self)",
            "pub async fn run(",
        ] {
            assert!(
                module.contains(item),
                "{}/mod.rs: no `{item}`",
                dir.display()
            );
        }
    }
}

#[test]
fn ccm_core_has_no_runtime_dependency() {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ccm-core/Cargo.toml");
    let text = std::fs::read_to_string(manifest).expect("read ccm-core/Cargo.toml");
    let deps = text
        .split("[dependencies]")
        .nth(1)
        .and_then(|rest| rest.split("\n[").next())
        .expect("a [dependencies] table");
    for forbidden in [
        "tokio ", "tokio.", "tokio=", "kube ", "kube.", "kube=", "kube-", "hyper", "axum",
    ] {
        assert!(
            !deps.lines().any(|l| l.trim_start().starts_with(forbidden)),
            "ccm-core depends on {forbidden:?}: it must not own a runtime or a client"
        );
    }
}

/// What a file over [`MAX_FILE_LINES`] must say, in a comment, to be allowed: why it is long.
const LONG_FILE_REASON: &str = "Longer than 800 lines:";
/// The size a source file stays under (ARCHITECTURE.md, rule 7).
const MAX_FILE_LINES: usize = 800;

#[test]
fn no_source_file_is_over_800_lines_unless_it_says_why() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for dir in [
        "ccm-core",
        "ccm-controllers",
        "ccm-testing",
        "examples",
        "tests",
    ] {
        let dir = root.join(dir);
        if dir.is_dir() {
            rust_files(&dir, &mut files);
        }
    }
    // Build output of the vendor template or of an example run from its own folder.
    files.retain(|f| !f.components().any(|c| c.as_os_str() == "target"));
    assert!(files.len() > 100, "found only {} .rs files", files.len());
    let too_long: Vec<String> = files
        .iter()
        .filter_map(|file| {
            let text = std::fs::read_to_string(file).expect("read a source file");
            let lines = text.lines().count();
            let says_why = text
                .lines()
                .any(|l| l.trim_start().starts_with("//") && l.contains(LONG_FILE_REASON));
            (lines > MAX_FILE_LINES && !says_why).then(|| {
                let relative = file.strip_prefix(&root).unwrap_or(file);
                format!("{} ({lines} lines)", relative.display())
            })
        })
        .collect();
    assert!(
        too_long.is_empty(),
        "split these files by concern, or say why in a comment containing {LONG_FILE_REASON:?}:\n{}",
        too_long.join("\n")
    );
}

/// Every module path a line names through `prefix` (`crate::`, `super::`, `self::`), whole
/// (`runtime::builder::Builder`), following groups (`prefix{a, b::c}`, `prefix a::{b, c}`) one
/// level deep; a group opened on this line and closed on a later one is continued through
/// `continued_group` (its path, a NUL, what was read of it).
fn module_paths(code: &str, prefix: &str, continued_group: &mut Option<String>) -> Vec<String> {
    let is_path = |c: char| c.is_alphanumeric() || c == '_' || c == ':';
    let mut found = Vec::new();
    // An item of a group under `head`; a nested `x::{y` counts as `x::y`.
    let mut push_group = |head: &str, items: &str| {
        for item in items.split(',') {
            let item: String = item
                .trim()
                .chars()
                .take_while(|c| is_path(*c) || *c == '{')
                .filter(|c| *c != '{')
                .collect();
            if !item.is_empty() {
                found.push(format!("{head}{item}"));
            }
        }
    };
    let mut rest = code;
    if let Some(group) = continued_group.take() {
        let (head, read) = group.split_once('\u{0}').unwrap_or(("", &group));
        match rest.find('}') {
            Some(end) => push_group(head, &format!("{read}{}", &rest[..end])),
            None => *continued_group = Some(format!("{group}{rest}")),
        }
        return found;
    }
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().last();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '$') {
            continue;
        }
        let head_len = rest.find(|c: char| !is_path(c)).unwrap_or(rest.len());
        let head = &rest[..head_len];
        match rest[head_len..].strip_prefix('{') {
            Some(group) => match group.find('}') {
                Some(end) => push_group(head, &group[..end]),
                None => *continued_group = Some(format!("{head}\u{0}{group}")),
            },
            None => push_group("", head),
        }
    }
    found
}

/// The source file (relative to `src/`) a module path names: the deepest `a/b.rs` or
/// `a/b/mod.rs` that exists along it (the rest are items), `None` for the crate root.
fn module_file(src: &Path, segments: &[&str]) -> Option<String> {
    let mut found = None;
    for depth in 1..=segments.len() {
        let dir = segments[..depth].join("/");
        if src.join(format!("{dir}.rs")).is_file() {
            found = Some(format!("{dir}.rs"));
        } else if src.join(&dir).join("mod.rs").is_file() {
            found = Some(format!("{dir}/mod.rs"));
        } else {
            break;
        }
    }
    found
}

/// The module path of a file under `src/` (`runtime/builder.rs` → `runtime::builder`,
/// `machinery/budget/mod.rs` → `machinery::budget`).
fn module_of(relative: &str) -> Vec<String> {
    let trimmed = relative.trim_end_matches(".rs");
    let mut segments: Vec<String> = trimmed.split('/').map(str::to_owned).collect();
    if segments.last().is_some_and(|s| s == "mod" || s == "lib") {
        segments.pop();
    }
    segments
}

/// The file that declares the module of `relative` (`runtime/builder.rs` → `runtime/mod.rs`,
/// `controllers/service/sync/node_sync.rs` → `controllers/service/sync.rs`).
fn parent_file(src: &Path, relative: &str) -> Option<String> {
    let own = module_of(relative);
    let parent: Vec<&str> = own
        .iter()
        .take(own.len().saturating_sub(1))
        .map(String::as_str)
        .collect();
    if own.is_empty() {
        None
    } else if parent.is_empty() {
        Some("lib.rs".to_owned())
    } else {
        module_file(src, &parent)
    }
}

/// The file-to-file import graph of `src/`: who names whom through `crate::`, `super::` or
/// `self::`. An import between a module and its own submodule (either way) is left out: a
/// parent declares its children and re-exports from them, and a child uses its parent's items,
/// by Rust's layout rather than by choice; the cycles that matter are among siblings and
/// across folders.
fn import_graph(src: &Path, files: &[PathBuf]) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut graph = std::collections::BTreeMap::<String, Vec<String>>::new();
    for file in files {
        let relative = file
            .strip_prefix(src)
            .expect("under src")
            .to_string_lossy()
            .replace('\\', "/");
        let own = module_of(&relative);
        let parent = &own[..own.len().saturating_sub(1)];
        let own_parent = parent_file(src, &relative);
        let text = std::fs::read_to_string(file).expect("read source");
        let mut edges = Vec::new();
        for (prefix, base) in [
            ("crate::", &[][..]),
            ("super::", parent),
            ("self::", &own[..]),
        ] {
            let mut group = None;
            for (_, code) in code_lines(&text) {
                for path in module_paths(code, prefix, &mut group) {
                    let mut segments: Vec<&str> = base.iter().map(String::as_str).collect();
                    segments.extend(path.split("::").filter(|s| !s.is_empty()));
                    if let Some(target) = module_file(src, &segments) {
                        let family = own_parent.as_ref() == Some(&target)
                            || parent_file(src, &target).as_ref() == Some(&relative);
                        if target != relative && !family && !edges.contains(&target) {
                            edges.push(target);
                        }
                    }
                }
            }
        }
        graph.insert(relative, edges);
    }
    graph
}

/// A cycle of `graph`, as the files along it, if there is one (depth-first search).
fn find_cycle(graph: &std::collections::BTreeMap<String, Vec<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &std::collections::BTreeMap<String, Vec<String>>,
        done: &mut std::collections::BTreeSet<String>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(start) = path.iter().position(|n| n == node) {
            let mut cycle = path[start..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flatten() {
            if let Some(cycle) = visit(next, graph, done, path) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = std::collections::BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut done, &mut Vec::new()))
}

/// Rule 1's "no import cycle", inside a layer too: the layer test above only sees imports that
/// point up, so two files of one layer importing each other (as `runtime/builder.rs` and
/// `runtime/start.rs` once did) pass it. This one follows every `crate::`, `super::` and
/// `self::` path to the file it names and fails on any cycle among the files.
#[test]
fn no_import_cycle_between_files() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let graph = import_graph(&src, &files);
    let edges: usize = graph.values().map(Vec::len).sum();
    assert!(edges > 100, "found only {edges} imports between files");
    assert_eq!(
        graph
            .get("runtime/start.rs")
            .map(|e| e.contains(&"runtime/builder.rs".to_owned())),
        Some(true),
        "the graph misses start.rs → builder.rs: {:?}",
        graph.get("runtime/start.rs")
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!("import cycle: {}", cycle.join(" → "));
    }
}

/// The cycle finder finds a two-file cycle and a longer one, and accepts a diamond.
#[test]
fn the_cycle_finder_finds_cycles() {
    let graph = |edges: &[(&str, &str)]| {
        let mut g = std::collections::BTreeMap::<String, Vec<String>>::new();
        for (from, to) in edges {
            g.entry((*from).to_owned())
                .or_default()
                .push((*to).to_owned());
            g.entry((*to).to_owned()).or_default();
        }
        g
    };
    assert!(find_cycle(&graph(&[("a", "b"), ("b", "a")])).is_some());
    assert!(find_cycle(&graph(&[("a", "b"), ("b", "c"), ("c", "a")])).is_some());
    assert!(find_cycle(&graph(&[("a", "b"), ("a", "c"), ("b", "d"), ("c", "d")])).is_none());
}

/// The path reader follows groups, nested ones and ones spread over lines.
#[test]
fn module_paths_follow_groups() {
    let mut group = None;
    let one = |code: &str, group: &mut Option<String>| module_paths(code, "crate::", group);
    assert_eq!(
        one(
            "use crate::machinery::{context, events::EventRecorder};",
            &mut group
        ),
        ["machinery::context", "machinery::events::EventRecorder"]
    );
    assert_eq!(
        one("let x = crate::runtime::builtin::table();", &mut group),
        ["runtime::builtin::table"]
    );
    assert!(one("use crate::{", &mut group).is_empty());
    assert!(one("    options::Options,", &mut group).is_empty());
    assert_eq!(
        one("    runtime::start::Exit };", &mut group),
        ["options::Options", "runtime::start::Exit"]
    );
    assert_eq!(group, None);
    assert_eq!(
        module_paths("use super::start::{Exit, fail};", "super::", &mut group),
        ["start::Exit", "start::fail"]
    );
}
