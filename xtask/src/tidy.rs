//! `cargo xtask tidy`, also run as a test of xtask (so `cargo xtask test` runs it): the checks
//! that keep the tree and its map honest, in the manner of rust-analyzer's tidy test.
//!
//! - Every Rust file starts with a module doc (`//!`), after at most a few inner attributes.
//! - Every Rust file is named in ARCHITECTURE.md, in its own crate's section (`### env-server`,
//!   `### env-server/dense (grove-dense)`: the longest heading that is a folder above the file),
//!   a test file in the part of that section from its `Tests:` paragraph on, any other file
//!   before it: by its path inside its crate's `src/` or `tests/` (`search/dense.rs`), by its
//!   file name (`dense.rs`), or by its module name in backticks (`` `dense` ``); a `mod.rs` by
//!   its folder (`search/`). A file name that other files of the same part share (`http.rs` in
//!   `net/` and in `search/`) names none of them: each is named by its path with its folder.
//!   `lib.rs` and `main.rs` directly in `src/` are their crate's entry and need no mention.
//! - Every subcommand of `trainer`, `env-server` and `cargo xtask` is named there in backticks
//!   with its program (`` `trainer train` ``, `` `env-server cache export` ``).
//! - Each crate's imports keep to the layers ARCHITECTURE.md draws for it, with no cycle between
//!   modules or files, and each crate's dependencies on the workspace's other crates point down its
//!   `crate-layers` block, never sideways or up (`layers.rs`).
//! - No test is switched off or passes by panicking: the attributes `ignore` and
//!   `should_panic` appear nowhere.
//!
//! Each finding names the file and what to do; all findings are reported at once.

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

/// The programs whose subcommands the map must name: (program as written, file of its clap
/// enums).
const PROGRAMS: [(&str, &str); 3] = [
    ("trainer", "trainer/src/cli/mod.rs"),
    ("env-server", "env-server/src/main.rs"),
    ("cargo xtask", "xtask/src/main.rs"),
];

/// Crate roots, named by their crate's entry rather than by file.
const ROOTS: [&str; 2] = ["lib.rs", "main.rs"];

pub fn run(root: &Path) -> Result<()> {
    let findings = check(root)?;
    if findings.is_empty() {
        println!("tidy: ok");
        return Ok(());
    }
    for f in &findings {
        eprintln!("tidy: {f}");
    }
    bail!("tidy: {} finding(s)", findings.len())
}

/// Every finding, as one line each.
pub fn check(root: &Path) -> Result<Vec<String>> {
    let map = std::fs::read_to_string(root.join("ARCHITECTURE.md"))?;
    let mut findings = Vec::new();
    let mut files = Vec::new();
    rust_files(root, root, &mut files)?;
    files.sort();
    let sections = sections(&map);
    // How many files share each (section, side, file name).
    let mut names: std::collections::HashMap<(String, bool, String), usize> = std::collections::HashMap::new();
    for rel in &files {
        if let Some(key) = scope_key(rel, &sections) {
            *names.entry(key).or_default() += 1;
        }
    }
    for rel in &files {
        let text = std::fs::read_to_string(root.join(rel))?;
        let shown = rel.display();
        if !has_module_doc(&text) {
            findings.push(format!("{shown}: no module doc; start the file with `//!` lines saying what it owns"));
        }
        for attr in forbidden_attributes(&text) {
            findings.push(format!("{shown}: `#[{attr}` switches a test off or makes panicking pass; fix the test"));
        }
        let key = scope_key(rel, &sections);
        let shared = key.as_ref().is_some_and(|k| names.get(k).copied().unwrap_or(0) > 1);
        let text_of =
            key.as_ref().and_then(|(dir, tests, _)| sections.iter().find(|s| &s.dir == dir).map(|s| s.part(*tests)));
        match text_of {
            None => findings.push(format!(
                "{shown}: no section of ARCHITECTURE.md's code map covers it; add a `### <crate folder>` section"
            )),
            Some(text) if !named_in_map(rel, text, shared) => findings.push(format!(
                "{shown}: not named in its crate's section of ARCHITECTURE.md ({}){}",
                if key.as_ref().is_some_and(|k| k.1) {
                    "from its `Tests:` paragraph on"
                } else {
                    "before its `Tests:` paragraph"
                },
                if shared && !rel.ends_with("mod.rs") {
                    "; other files there share its name, so name it with its folder"
                } else {
                    ""
                }
            )),
            Some(_) => {}
        }
    }
    match crate::layers::crate_block(&map) {
        Some(layers) => findings.extend(crate::layers::check_workspace(root, &layers)?),
        None => findings.push("ARCHITECTURE.md has no ```crate-layers block (the workspace's crates by layer)".into()),
    }
    for (src, layers) in crate::layers::blocks(&map) {
        findings.extend(crate::layers::check_crate(root, &src, &layers)?);
    }
    for (program, file) in PROGRAMS {
        let text = std::fs::read_to_string(root.join(file))?;
        for command in subcommands(&text) {
            let needle = format!("`{program} {command}");
            let found = map.match_indices(&needle).any(|(i, _)| {
                // Whole name: followed by the closing backtick, a space or an argument.
                map[i + needle.len()..].starts_with(['`', ' ', '['])
            });
            if !found {
                findings.push(format!("{file}: subcommand `{program} {command}` is not in ARCHITECTURE.md"));
            }
        }
    }
    Ok(findings)
}

/// One `### <folder>` section of the code map: the folder, its text before the line that starts
/// with `Tests:`, and from there on.
struct Section {
    dir: String,
    body: String,
    tests: String,
}

impl Section {
    /// The text a file is looked up in; a section without a `Tests:` paragraph is one part.
    fn part(&self, tests: bool) -> &str {
        if tests && !self.tests.is_empty() { &self.tests } else { &self.body }
    }
}

/// The code map's crate sections (headings `### folder` or `### folder (crate name)`).
fn sections(map: &str) -> Vec<Section> {
    let mut out: Vec<Section> = Vec::new();
    let mut in_tests = false;
    for line in map.lines() {
        if let Some(head) = line.strip_prefix("### ") {
            let dir = head.split_whitespace().next().unwrap_or_default().to_string();
            out.push(Section { dir, body: String::new(), tests: String::new() });
            in_tests = false;
            continue;
        }
        if line.starts_with("## ") {
            // The end of the code map's sections.
            if !out.is_empty() {
                out.push(Section { dir: String::new(), body: String::new(), tests: String::new() });
            }
            continue;
        }
        let Some(section) = out.last_mut() else { continue };
        if line.starts_with("Tests:") {
            in_tests = true;
        }
        let part = if in_tests { &mut section.tests } else { &mut section.body };
        part.push_str(line);
        part.push('\n');
    }
    out.retain(|s| !s.dir.is_empty());
    out
}

/// The section that covers `rel` (the longest folder above it), whether `rel` is a test file of
/// it, and its file name.
fn scope_key(rel: &Path, sections: &[Section]) -> Option<(String, bool, String)> {
    let path = rel.to_string_lossy().replace('\\', "/");
    let section = sections.iter().filter(|s| path.starts_with(&format!("{}/", s.dir))).max_by_key(|s| s.dir.len())?;
    let inside = &path[section.dir.len() + 1..];
    let tests = inside.starts_with("tests/") || (section.dir == "tests" && !inside.starts_with("src/"));
    let name = rel.file_name()?.to_string_lossy().into_owned();
    Some((section.dir.clone(), tests, name))
}

/// Rust files of the workspace, relative to `root`, outside build outputs and hidden folders.
fn rust_files(root: &Path, dir: &Path, out: &mut Vec<PathBuf>) -> Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            if name.starts_with('.') || ["target", "runs", "corpus", "artifacts", "node_modules"].contains(&&*name) {
                continue;
            }
            rust_files(root, &path, out)?;
        } else if name.ends_with(".rs") {
            out.push(path.strip_prefix(root)?.to_path_buf());
        }
    }
    Ok(())
}

fn has_module_doc(text: &str) -> bool {
    text.lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with("#![") && !l.starts_with("// "))
        .is_some_and(|l| l.starts_with("//!"))
}

/// The attributes that switch a test off, as they appear in `text`.
fn forbidden_attributes(text: &str) -> Vec<&'static str> {
    // Spelled in two halves so that this file does not find itself.
    let names: [&'static str; 2] = [concat!("ign", "ore"), concat!("should", "_panic")];
    names.into_iter().filter(|n| text.contains(&format!("#[{n}"))).collect()
}

/// Whether ARCHITECTURE.md names the file `rel` (see the module doc for the accepted forms);
/// `shared`: other files of the workspace have its file name.
fn named_in_map(rel: &Path, map: &str, shared: bool) -> bool {
    let parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let Some(file) = parts.last() else { return true };
    // The path inside the crate's `src/` or `tests/` (or the whole path when it has neither).
    let inner = match parts.iter().rposition(|p| p == "src" || p == "tests" || p == "fuzz_targets") {
        Some(i) => parts[i + 1..].join("/"),
        None => parts.join("/"),
    };
    if ROOTS.contains(&file.as_str()) && !inner.contains('/') {
        return true;
    }
    if file == "mod.rs" {
        let folder = inner.trim_end_matches("mod.rs");
        return map.contains(folder) || map.contains(&format!("{folder}mod.rs"));
    }
    let stem = file.trim_end_matches(".rs");
    if shared {
        // Only a path with a folder tells it from the others, as a whole path segment.
        let whole = parts.join("/");
        let by_path = |needle: &str| {
            map.match_indices(needle)
                .any(|(i, _)| i == 0 || !map[..i].ends_with(|c: char| c.is_alphanumeric() || c == '_'))
        };
        return (inner.contains('/') && by_path(&inner)) || by_path(&whole) || by_path(&format!("src/{inner}"));
    }
    map.contains(&inner) || map.contains(file.as_str()) || map.contains(&format!("`{stem}`"))
}

/// The subcommands of the clap enums in `text`, as the command line spells them; a variant that
/// holds another subcommand enum is followed by that enum's subcommands
/// (`cache`, `cache export`, `cache import`).
fn subcommands(text: &str) -> Vec<String> {
    let enums = subcommand_enums(text);
    let Some((_, top)) = enums.iter().find(|(name, _)| !enums.iter().any(|(_, vs)| vs.iter().any(|v| v.1 == *name)))
    else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (variant, inner) in top {
        let name = kebab(variant);
        out.push(name.clone());
        if let Some((_, nested)) = enums.iter().find(|(n, _)| n == inner) {
            out.extend(nested.iter().map(|(v, _)| format!("{name} {}", kebab(v))));
        }
    }
    out
}

/// `(enum name, [(variant, the type it wraps or "")])` of every `#[derive(.. Subcommand ..)]`
/// enum, read from the source's layout (variants at four spaces).
fn subcommand_enums(text: &str) -> Vec<(String, Vec<(String, String)>)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let derive = lines[i].trim_start().starts_with("#[derive(") && lines[i].contains("Subcommand");
        i += 1;
        if !derive {
            continue;
        }
        while i < lines.len() && !lines[i].contains("enum ") {
            i += 1;
        }
        let Some(name) = lines.get(i).and_then(|l| l.split("enum ").nth(1)).and_then(|r| r.split_whitespace().next())
        else {
            break;
        };
        let mut variants = Vec::new();
        i += 1;
        while i < lines.len() && !lines[i].starts_with('}') {
            let l = lines[i];
            if let Some(rest) = l.strip_prefix("    ")
                && rest.starts_with(|c: char| c.is_ascii_uppercase())
            {
                let ident: String = rest.chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
                let inner = rest[ident.len()..]
                    .trim_start_matches('(')
                    .split([')', ',', ' '])
                    .next()
                    .unwrap_or_default()
                    .rsplit("::")
                    .next()
                    .unwrap_or_default()
                    .to_string();
                variants.push((ident, inner));
            }
            i += 1;
        }
        out.push((name.to_string(), variants));
    }
    out
}

/// `BenchDense` -> `bench-dense`, as clap names subcommands.
fn kebab(ident: &str) -> String {
    let mut out = String::new();
    for (i, c) in ident.chars().enumerate() {
        if c.is_ascii_uppercase() {
            if i > 0 {
                out.push('-');
            }
            out.push(c.to_ascii_lowercase());
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tree_is_tidy() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let findings = check(root).unwrap();
        assert!(findings.is_empty(), "`cargo xtask tidy` findings:\n{}", findings.join("\n"));
    }

    #[test]
    fn the_checks_catch_what_they_are_for() {
        assert!(has_module_doc("#![allow(x)]\n\n//! Doc.\nfn f() {}"));
        assert!(!has_module_doc("/// Item doc.\nfn f() {}"));
        assert!(!has_module_doc("use x;\n//! late"));
        let attr = format!("#[{}]\nfn t() {{}}", concat!("ign", "ore"));
        assert_eq!(forbidden_attributes(&attr), [concat!("ign", "ore")]);
        let map = "`search/dense.rs` and `rows`, and net/ is the folder";
        assert!(named_in_map(Path::new("env-server/src/search/dense.rs"), map, false));
        assert!(named_in_map(Path::new("trainer/src/rows.rs"), map, false));
        assert!(named_in_map(Path::new("env-server/src/net/mod.rs"), map, false));
        assert!(named_in_map(Path::new("trainer/src/main.rs"), map, false));
        assert!(!named_in_map(Path::new("trainer/src/sft.rs"), map, false));
        assert!(!named_in_map(Path::new("env-server/src/sim/mod.rs"), map, false));
        // A shared file name names none of the files that share it; a path with a folder does.
        let map = "- `http.rs`: one of them; `search/http.rs`: the other";
        assert!(!named_in_map(Path::new("env-server/src/net/http.rs"), map, true));
        assert!(named_in_map(Path::new("env-server/src/search/http.rs"), map, true));
        assert!(!named_in_map(Path::new("env-server/src/research/http.rs"), map, true), "a whole segment");
        // Each file is looked up in its own crate's section, tests from `Tests:` on.
        let sections =
            sections("## Code map\n### a\n- `x.rs`\nTests:\n- `y.rs`\n### a/b (c)\n- `z.rs`\n## Commands\n`w.rs`");
        let key = |p: &str| scope_key(Path::new(p), &sections);
        assert_eq!(key("a/src/x.rs"), Some(("a".into(), false, "x.rs".into())));
        assert_eq!(key("a/tests/it/y.rs"), Some(("a".into(), true, "y.rs".into())));
        assert_eq!(key("a/b/src/z.rs"), Some(("a/b".into(), false, "z.rs".into())));
        assert_eq!(key("d/src/w.rs"), None);
        let part = |dir: &str, tests: bool| sections.iter().find(|s| s.dir == dir).unwrap().part(tests).to_string();
        assert!(part("a", false).contains("x.rs") && !part("a", false).contains("y.rs"));
        assert!(part("a", true).contains("y.rs") && !part("a/b", false).contains("w.rs"));
        let src = "#[derive(Subcommand)]\nenum Command {\n    /// Doc.\n    Serve(ServeArgs),\n    \
                   #[command(subcommand)]\n    Cache(CacheCommand),\n    BenchDense { x: u8 },\n}\n\n\
                   #[derive(Subcommand)]\nenum CacheCommand {\n    Export {\n        a: u8,\n    },\n    Import,\n}\n";
        assert_eq!(subcommands(src), ["serve", "cache", "cache export", "cache import", "bench-dense"]);
    }
}
