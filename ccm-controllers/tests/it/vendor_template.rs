//! `tests/vendor-template/` is the provider of docs/writing-a-provider.md as a vendor writes it:
//! its crates outside this workspace, with exactly the guide's `Cargo.toml`s and code. CI builds
//! and tests it (`.ci/run`); this test fails when it and the guide drift apart.
//!
//! The template's files are generated from the guide: after changing the guide, run
//! `CCM_UPDATE_VENDOR_TEMPLATE=1 cargo test -p ccm-controllers --test it vendor_template::`.
//! The only difference allowed is the path to this repository: the guide puts it next to the
//! vendor's crates (`../ccm-rs/`), the template lives three directories inside it (`../../../`).
#![allow(clippy::panic)]

use std::path::{Path, PathBuf};

/// Set to regenerate the template's files from the guide instead of comparing them.
const UPDATE_ENV: &str = "CCM_UPDATE_VENDOR_TEMPLATE";

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_owned()
}

fn read(relative: &str) -> String {
    let path = repo().join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A fenced code block of a Markdown page: its info string (` ```rust,no_run ` gives
/// `rust,no_run`) and its lines.
struct Block {
    info: String,
    lines: Vec<String>,
}

impl Block {
    /// The code as the reader sees it: rustdoc hides `# ` lines (and a lone `#`) of Rust blocks.
    fn visible(&self) -> String {
        let hidden = |line: &str| line == "#" || line.starts_with("# ");
        let rust = self.info.starts_with("rust");
        let mut code = String::new();
        for line in &self.lines {
            if !(rust && hidden(line)) {
                code.push_str(line);
                code.push('\n');
            }
        }
        code
    }
}

fn blocks(page: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut open: Option<Block> = None;
    for line in page.lines() {
        match (open.take(), line.strip_prefix("```")) {
            (None, Some(info)) => {
                open = Some(Block {
                    info: info.trim().to_owned(),
                    lines: Vec::new(),
                })
            }
            (None, None) => {}
            (Some(block), Some("")) => blocks.push(block),
            (Some(mut block), _) => {
                block.lines.push(line.to_owned());
                open = Some(block);
            }
        }
    }
    assert!(open.is_none(), "an unclosed code block in the guide");
    blocks
}

/// The one block of `kind` (the info string's language) whose visible code contains `marker`.
fn block_with(blocks: &[Block], kind: &str, marker: &str) -> String {
    let found: Vec<String> = blocks
        .iter()
        .filter(|b| b.info.split(',').next() == Some(kind))
        .map(Block::visible)
        .filter(|code| code.contains(marker))
        .collect();
    match found.as_slice() {
        [code] => code.clone(),
        _ => panic!(
            "docs/writing-a-provider.md has {} ```{kind} blocks containing {marker:?}, expected one",
            found.len()
        ),
    }
}

/// The guide's dependency paths, from the template's crates.
fn template_paths(toml: &str) -> String {
    toml.replace("\"../ccm-rs/", "\"../../../")
}

/// Every file of the template that the guide gives, with its expected contents.
fn expected_files() -> Vec<(&'static str, String)> {
    let page = read("docs/writing-a-provider.md");
    let blocks = blocks(&page);

    // The provider crate: step 2's Cargo.toml, and steps 4 to 9 as `src/lib.rs` (the guide's
    // own doc test checks that docs/acme/*.rs are its blocks).
    let provider_toml = template_paths(&block_with(&blocks, "toml", "name = \"acme-cloud\""));
    let mut provider = String::from(
        "//! The Acme cloud provider of docs/writing-a-provider.md (steps 4 to 9, generated).\n\n",
    );
    let parts = [
        "header",
        "errors",
        "instances",
        "load_balancer",
        "routes",
        "cloud",
    ];
    for (i, part) in parts.iter().enumerate() {
        if i > 0 {
            provider.push('\n');
        }
        provider.push_str(&read(&format!("docs/acme/{part}.rs")));
    }
    let conformance = block_with(&blocks, "rust", "fn acme_suite(");

    // The binary crate: `cargo new --bin acme-ccm`, step 10's dependencies and main.rs, step 12's
    // dev-dependencies and test.
    let binary_toml = format!(
        "[package]\nname = \"acme-ccm\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n{}\n{}",
        template_paths(&block_with(&blocks, "toml", "acme-cloud = { path")),
        template_paths(&block_with(
            &blocks,
            "toml",
            "# to seed the in-memory account"
        )),
    );
    let main = block_with(&blocks, "rust", "// src/main.rs");
    let whole_ccm = block_with(&blocks, "rust", "Builder::new()");

    vec![
        ("acme-cloud/Cargo.toml", provider_toml),
        ("acme-cloud/src/lib.rs", provider),
        ("acme-cloud/tests/conformance.rs", conformance),
        ("acme-ccm/Cargo.toml", binary_toml),
        ("acme-ccm/src/main.rs", main),
        ("acme-ccm/tests/whole_ccm.rs", whole_ccm),
    ]
}

#[test]
fn the_vendor_template_is_the_guide() {
    let template = repo().join("tests/vendor-template");
    let update = std::env::var_os(UPDATE_ENV).is_some();
    let mut drifted = Vec::new();
    for (file, expected) in expected_files() {
        let path = template.join(file);
        if update {
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &expected).unwrap();
            continue;
        }
        let actual = std::fs::read_to_string(&path).unwrap_or_default();
        if actual != expected {
            drifted.push(format!(
                "--- tests/vendor-template/{file} should be:\n{expected}"
            ));
        }
    }
    assert!(
        drifted.is_empty(),
        "tests/vendor-template/ and docs/writing-a-provider.md differ; regenerate the template \
         with `{UPDATE_ENV}=1 cargo test -p ccm-controllers --test it vendor_template::`\n{}",
        drifted.join("\n")
    );
}

#[test]
fn the_guide_blocks_are_found() {
    // The extraction itself: hidden lines are dropped, fences close blocks.
    let page = "text\n```rust\n# hidden\nvisible\n#\n```\n```toml\n# a comment\n```\n";
    let blocks = blocks(page);
    assert_eq!(blocks.len(), 2);
    assert_eq!(blocks[0].visible(), "visible\n");
    assert_eq!(blocks[1].visible(), "# a comment\n");
}
