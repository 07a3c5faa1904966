//! The import-graph half of `cargo xtask tidy`: the layers ARCHITECTURE.md draws for a crate,
//! checked against the `crate::` / `super::` paths its files really use.
//!
//! A crate's layers are a fenced block in ARCHITECTURE.md whose info string is `layers` and the
//! crate's source folder, highest layer first, one per line (`name: module, module, ...`):
//!
//! ````text
//! ```layers trainer/src
//! workflows: train, sft
//! engine:    model, tokenizer
//! ```
//! ````
//!
//! A layer's members are module paths at any depth (`engine`, `rl/train`): a wing folder may be
//! one member, or hold members of several layers. The rules: every module of the folder is held by
//! exactly one member (the longest that holds it; the crate roots, and a folder that only groups
//! members, aside); a member uses members of its own layer or below, never above; and there is no
//! cycle, neither between members nor between files (a folder's `mod.rs` and the files inside it
//! are one module to the rest, and may use each other). A file's
//! test module (from its `#[cfg(test)]` on) and comments are not read. Each finding names the
//! file, the path it uses and the rule.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::Path;

use anyhow::{Context, Result};

/// A crate's layers as the map draws them: (layer name, its top-level modules), highest first.
pub type Layers = Vec<(String, Vec<String>)>;

/// Every `layers` block of `map`: (source folder, its layers).
pub fn blocks(map: &str) -> Vec<(String, Layers)> {
    fenced_layers(map, "layers").into_iter().filter(|(dir, _)| !dir.is_empty()).collect()
}

/// Every fenced block of `map` whose info string's first word is `info`: (the rest of the info
/// string, its layers, highest first, one per line: `name: member, member`).
fn fenced_layers(map: &str, info: &str) -> Vec<(String, Layers)> {
    let mut out = Vec::new();
    let mut current: Option<(String, Layers)> = None;
    for line in map.lines() {
        let trimmed = line.trim();
        if let Some((arg, layers)) = current.as_mut() {
            if trimmed.starts_with("```") {
                out.push((std::mem::take(arg), std::mem::take(layers)));
                current = None;
            } else if let Some((name, members)) = trimmed.split_once(':') {
                let members = members.split(',').map(|m| m.trim().to_string()).filter(|m| !m.is_empty()).collect();
                layers.push((name.trim().to_string(), members));
            }
        } else if let Some(rest) = trimmed.strip_prefix("```") {
            let (word, arg) = rest.split_once(' ').unwrap_or((rest, ""));
            if word == info {
                current = Some((arg.trim().to_string(), Vec::new()));
            }
        }
    }
    out
}

/// The module path of a file relative to its crate's source folder (`rollout/agent.rs` ->
/// `rollout::agent`, `rollout/mod.rs` -> `rollout`); the crate roots are the empty path.
fn module_of(rel: &str) -> Vec<String> {
    let stem = rel.strip_suffix(".rs").unwrap_or(rel);
    let mut parts: Vec<String> = stem.split('/').map(str::to_string).collect();
    if parts.last().is_some_and(|p| p == "mod") || (parts.len() == 1 && (parts[0] == "lib" || parts[0] == "main")) {
        parts.pop();
    }
    parts
}

/// The text of a file that the graph is read from: comments dropped, its test module cut off.
fn code_of(text: &str) -> String {
    let text = match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => text,
    };
    text.lines().map(|l| l.split("//").next().unwrap_or_default()).collect::<Vec<_>>().join("\n")
}

fn ident(s: &str) -> (&str, &str) {
    let end = s.find(|c: char| !(c.is_alphanumeric() || c == '_')).unwrap_or(s.len());
    (&s[..end], &s[end..])
}

/// The paths after each `crate::` / `super::` in `code`, as segments relative to the crate root
/// (`super` resolved against `me`, the file's module path: `super` of `a::b`, a file `a/b.rs` or
/// a folder's `a/b/mod.rs`, is `a`). `use crate::{a::x, b}` gives `a::x` and `b`.
fn paths(code: &str, me: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut parent = me.to_vec();
    parent.pop();
    for (anchor, base) in [("crate::", Vec::new()), ("super::", parent)] {
        let mut at = 0;
        while let Some(i) = code[at..].find(anchor) {
            let start = at + i;
            at = start + anchor.len();
            // A whole word: not `xcrate::` or `a::crate::`.
            if code[..start].chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
                continue;
            }
            // `super::super::x` climbs once more per `super`.
            let (mut base, mut rest) = (base.clone(), &code[at..]);
            while let Some(next) = rest.strip_prefix("super::") {
                base.pop();
                rest = next;
            }
            let mut prefixes = vec![(base, rest)];
            while let Some((mut segs, mut rest)) = prefixes.pop() {
                loop {
                    if let Some(group) = rest.strip_prefix('{') {
                        // One level of a brace group: each item continues the path.
                        let mut depth = 0;
                        let mut item_start = 0;
                        for (j, c) in group.char_indices() {
                            match c {
                                '{' => depth += 1,
                                '}' if depth == 0 => {
                                    prefixes.push((segs.clone(), group[item_start..j].trim_start()));
                                    break;
                                }
                                '}' => depth -= 1,
                                ',' if depth == 0 => {
                                    prefixes.push((segs.clone(), group[item_start..j].trim_start()));
                                    item_start = j + 1;
                                }
                                _ => {}
                            }
                        }
                        segs.clear();
                        break;
                    }
                    let (name, after) = ident(rest);
                    if name.is_empty() || name == "self" || name == "super" {
                        break;
                    }
                    segs.push(name.to_string());
                    match after.strip_prefix("::") {
                        Some(next) => rest = next,
                        None => break,
                    }
                }
                if !segs.is_empty() {
                    out.push(segs);
                }
            }
        }
    }
    out
}

/// The findings for one crate: `src` is its source folder relative to `root`.
pub fn check_crate(root: &Path, src: &str, layers: &Layers) -> Result<Vec<String>> {
    let dir = root.join(src);
    let mut files = Vec::new();
    collect(&dir, &dir, &mut files)?;
    files.sort();
    let modules: HashMap<Vec<String>, String> = files.iter().map(|f| (module_of(f), f.clone())).collect();
    let mut findings = Vec::new();
    // The layers' members: module paths at any depth (`engine`, `rl/train`), each in one layer.
    let mut layer_of: HashMap<Vec<String>, usize> = HashMap::new();
    for (rank, (name, members)) in layers.iter().enumerate() {
        for m in members {
            let path: Vec<String> = m.split('/').map(str::to_string).collect();
            if !modules.keys().any(|k| k.starts_with(&path)) {
                findings.push(format!("{src}: layer {name} names `{m}`, which is no module there"));
            }
            if layer_of.insert(path, rank).is_some() {
                findings.push(format!("{src}: module `{m}` is in two layers of ARCHITECTURE.md (the second: {name})"));
            }
        }
    }
    // A module's unit: the longest member that holds it. A folder that only groups members (a
    // wing's `mod.rs`) has none and is one with each of them.
    let unit_of = |m: &[String]| -> Option<Vec<String>> {
        (1..=m.len()).rev().map(|k| m[..k].to_vec()).find(|p| layer_of.contains_key(p))
    };
    let mut unplaced = BTreeSet::new();
    for m in modules.keys() {
        let groups_members = layer_of.keys().any(|l| l.len() > m.len() && l.starts_with(m));
        if !m.is_empty() && unit_of(m).is_none() && !groups_members {
            unplaced.insert(m.join("/"));
        }
    }
    for m in unplaced {
        findings.push(format!("{src}: module `{m}` is in no layer of ARCHITECTURE.md's `layers {src}` block"));
    }
    // Edges between files, and between units.
    let mut file_edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut top_edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for rel in &files {
        let me = module_of(rel);
        let text = std::fs::read_to_string(dir.join(rel)).with_context(|| format!("read {src}/{rel}"))?;
        for path in paths(&code_of(&text), &me) {
            let Some(target) = (1..=path.len()).rev().map(|k| path[..k].to_vec()).find(|p| modules.contains_key(p))
            else {
                continue;
            };
            // A folder is one module to the rest of the crate: its `mod.rs` and the files inside
            // it may use each other (types in the parent, steps in the children).
            if me.is_empty() || target.is_empty() || target.starts_with(&me) || me.starts_with(&target) {
                continue;
            }
            file_edges.entry(rel.clone()).or_default().insert(modules[&target].clone());
            let (Some(from), Some(to)) = (unit_of(&me), unit_of(&target)) else { continue };
            if from == to {
                continue;
            }
            top_edges.entry(from.join("/")).or_default().insert(to.join("/"));
            let (a, b) = (layer_of[&from], layer_of[&to]);
            if b < a {
                findings.push(format!(
                    "{src}/{rel}: uses `crate::{}`, in layer {} above its own ({}); move the code down or the arrow's other end up",
                    path.join("::"),
                    layers[b].0,
                    layers[a].0
                ));
            }
        }
    }
    for cycle in cycles(&top_edges) {
        findings.push(format!("{src}: the modules {} use each other (a cycle); break it", cycle.join(" -> ")));
    }
    for cycle in cycles(&file_edges) {
        findings.push(format!("{src}: the files {} use each other (a cycle); break it", cycle.join(" -> ")));
    }
    Ok(findings)
}

/// The workspace's crate layers as the map draws them: the one fenced block whose info string is
/// `crate-layers`, highest first, one layer per line (`name: package, package`).
pub fn crate_block(map: &str) -> Option<Layers> {
    fenced_layers(map, "crate-layers").into_iter().next().map(|(_, layers)| layers)
}

/// The findings for the workspace's crates: every member package is in exactly one layer, and
/// each of its dependencies on another member (normal, build or target-specific; dev-dependencies
/// are the tests' and may reach anywhere) points to a strictly lower layer. So no two crates of a
/// layer depend on each other: the trainer never depends on the env-server (only its tests do),
/// and a shared leaf crate never on a program.
pub fn check_workspace(root: &Path, layers: &Layers) -> Result<Vec<String>> {
    let read = |path: &Path| -> Result<toml::Table> {
        let text = std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))?;
        toml::from_str(&text).with_context(|| format!("parse {}", path.display()))
    };
    let workspace = read(&root.join("Cargo.toml"))?;
    let members: Vec<String> = workspace
        .get("workspace")
        .and_then(|w| w.get("members"))
        .and_then(|m| m.as_array())
        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
        .unwrap_or_default();
    let mut findings = Vec::new();
    let mut layer_of: HashMap<String, usize> = HashMap::new();
    for (rank, (name, packages)) in layers.iter().enumerate() {
        for p in packages {
            if layer_of.insert(p.clone(), rank).is_some() {
                findings.push(format!("crate-layers: `{p}` is in two layers (the second: {name})"));
            }
        }
    }
    let mut manifests = Vec::new();
    for dir in &members {
        let manifest = read(&root.join(dir).join("Cargo.toml"))?;
        let name = manifest.get("package").and_then(|p| p.get("name")).and_then(|n| n.as_str()).unwrap_or(dir);
        manifests.push((dir.clone(), name.to_string(), manifest));
    }
    let packages: BTreeSet<&str> = manifests.iter().map(|(_, n, _)| n.as_str()).collect();
    for p in layer_of.keys() {
        if !packages.contains(p.as_str()) {
            findings.push(format!("crate-layers names `{p}`, which is no member of the workspace"));
        }
    }
    for (dir, name, manifest) in &manifests {
        let Some(&mine) = layer_of.get(name) else {
            findings.push(format!("{dir}/Cargo.toml: `{name}` is in no layer of ARCHITECTURE.md's crate-layers block"));
            continue;
        };
        let mut tables: Vec<(&str, &toml::Table)> = Vec::new();
        for kind in ["dependencies", "build-dependencies"] {
            if let Some(t) = manifest.get(kind).and_then(|t| t.as_table()) {
                tables.push((kind, t));
            }
        }
        if let Some(targets) = manifest.get("target").and_then(|t| t.as_table()) {
            for spec in targets.values() {
                for kind in ["dependencies", "build-dependencies"] {
                    if let Some(t) = spec.get(kind).and_then(|t| t.as_table()) {
                        tables.push((kind, t));
                    }
                }
            }
        }
        for (kind, table) in tables {
            for dep in table.keys() {
                let Some(&theirs) = layer_of.get(dep) else { continue };
                if theirs <= mine {
                    findings.push(format!(
                        "{dir}/Cargo.toml: `{name}` ({}) has `{dep}` ({}) in [{kind}]; a crate depends only on \
                         crates of lower layers (a test may use it as a dev-dependency)",
                        layers[mine].0, layers[theirs].0
                    ));
                }
            }
        }
    }
    Ok(findings)
}

fn collect(base: &Path, dir: &Path, out: &mut Vec<String>) -> Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        let path = entry.path();
        if entry.file_type()?.is_dir() {
            collect(base, &path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path.strip_prefix(base)?.to_string_lossy().replace('\\', "/"));
        }
    }
    Ok(())
}

/// The strongly connected components of more than one node, each as a path through it.
fn cycles(edges: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    // Tarjan's algorithm; the graphs are small, so recursion depth is no concern.
    struct State<'a> {
        edges: &'a BTreeMap<String, BTreeSet<String>>,
        index: HashMap<&'a str, usize>,
        low: HashMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(s: &mut State<'a>, v: &'a str) {
        let i = s.index.len();
        s.index.insert(v, i);
        s.low.insert(v, i);
        s.stack.push(v);
        s.on.insert(v);
        if let Some(next) = s.edges.get(v) {
            for w in next {
                if !s.index.contains_key(w.as_str()) {
                    visit(s, w);
                    let lw = s.low[w.as_str()];
                    let lv = s.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(lw);
                } else if s.on.contains(w.as_str()) {
                    let iw = s.index[w.as_str()];
                    let lv = s.low.get_mut(v).expect("visited");
                    *lv = (*lv).min(iw);
                }
            }
        }
        if s.low[v] == s.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = s.stack.pop() {
                s.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.reverse();
                s.out.push(comp);
            }
        }
    }
    let mut s = State {
        edges,
        index: HashMap::new(),
        low: HashMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in edges.keys() {
        if !s.index.contains_key(v.as_str()) {
            visit(&mut s, v);
        }
    }
    s.out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plant(files: &[(&str, &str)]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for (rel, text) in files {
            let path = dir.path().join("src").join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        }
        dir
    }

    #[test]
    fn paths_resolve_crate_super_and_groups() {
        let me = vec!["rollout".to_string(), "agent".to_string()];
        let code = "use crate::{model::{Kv, Mask}, rows::Row};\nuse super::tree::Tree;\nfn f() { crate::env::x(); }";
        let got: BTreeSet<String> = paths(code, &me).into_iter().map(|p| p.join("::")).collect();
        let want: BTreeSet<String> = ["model::Kv", "model::Mask", "rows::Row", "rollout::tree::Tree", "env::x"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        assert_eq!(got, want);
        // A `mod.rs`'s `super` is its parent's module; each further `super` climbs one more.
        let deep = paths("use super::super::model::M;", &me);
        assert_eq!(deep, vec![vec!["model".to_string(), "M".to_string()]]);
        let got = paths("use super::rows::Row;", &["rollout".to_string()]);
        assert_eq!(got, vec![vec!["rows".to_string(), "Row".to_string()]]);
        assert!(paths(&code_of("// use crate::x;\nlet a = 1; // crate::y\n"), &me).is_empty());
    }

    /// A planted back-edge and a planted cycle are found; the same crate without them passes.
    #[test]
    fn a_back_edge_and_a_cycle_are_found() {
        let map = "```layers src\nhigh: train\nlow: model, rows\n```\n";
        let layers = blocks(map).remove(0).1;
        let clean = [
            ("lib.rs", "//! Root.\npub mod model;\npub mod rows;\npub mod train;"),
            ("model.rs", "//! Model.\npub struct M;"),
            ("rows.rs", "//! Rows.\nuse crate::model::M;"),
            ("train/mod.rs", "//! Train.\nuse crate::rows::*;\nmod step;"),
            (
                "train/step.rs",
                "//! Step.\nuse super::super::model::M;\n#[cfg(test)]\nmod tests { use crate::train::*; }",
            ),
        ];
        let dir = plant(&clean);
        assert_eq!(check_crate(dir.path(), "src", &layers).unwrap(), Vec::<String>::new());
        // The model (low) uses the training loop (high).
        let dir = plant(&[clean[0], clean[2], clean[3], clean[4], ("model.rs", "//! Model.\nuse crate::train::step;")]);
        let findings = check_crate(dir.path(), "src", &layers).unwrap();
        assert!(findings.iter().any(|f| f.contains("src/model.rs: uses `crate::train::step`")), "{findings:?}");
        assert!(findings.iter().any(|f| f.contains("cycle")), "model -> train -> rows -> model: {findings:?}");
        // Two files of one folder that use each other.
        let dir = plant(&[
            clean[0],
            clean[1],
            clean[2],
            ("train/mod.rs", "//! T.\nmod step;\nmod trees;\nuse crate::train::step::y;"),
            ("train/step.rs", "//! S.\nuse super::trees::t;"),
            ("train/trees.rs", "//! T.\nuse crate::train::step::s;"),
        ]);
        let findings = check_crate(dir.path(), "src", &layers).unwrap();
        assert!(findings.iter().any(|f| f.contains("files train/step.rs -> train/trees.rs")), "{findings:?}");
        // A module in no layer.
        let dir = plant(&[clean[0], clean[1], clean[2], clean[3], clean[4], ("extra.rs", "//! E.")]);
        let findings = check_crate(dir.path(), "src", &layers).unwrap();
        assert!(findings.iter().any(|f| f.contains("`extra` is in no layer")), "{findings:?}");
    }

    /// Members inside a wing folder: the wing's `mod.rs` only groups them, and each keeps its layer.
    #[test]
    fn members_inside_a_wing_keep_their_layers() {
        let map = "```layers src\nhigh: rl/train\nmid: rl/rows\nlow: engine\n```\n";
        let layers = blocks(map).remove(0).1;
        let clean = [
            ("lib.rs", "//! Root.\npub mod engine;\npub mod rl;"),
            ("engine/mod.rs", "//! Engine.\npub mod model;"),
            ("engine/model.rs", "//! Model.\npub struct M;"),
            ("rl/mod.rs", "//! RL.\npub mod rows;\npub mod train;"),
            ("rl/rows.rs", "//! Rows.\nuse crate::engine::model::M;"),
            ("rl/train.rs", "//! Train.\nuse crate::rl::rows::R;\nuse super::rows::S;"),
        ];
        let dir = plant(&clean);
        assert_eq!(check_crate(dir.path(), "src", &layers).unwrap(), Vec::<String>::new());
        // rows (mid) reaching up to train (high), inside one wing.
        let dir = plant(&[
            clean[0],
            clean[1],
            clean[2],
            clean[3],
            clean[5],
            ("rl/rows.rs", "//! Rows.\nuse super::train::T;"),
        ]);
        let findings = check_crate(dir.path(), "src", &layers).unwrap();
        assert!(findings.iter().any(|f| f.contains("src/rl/rows.rs: uses `crate::rl::train::T`")), "{findings:?}");
        // A module of the wing that no member holds.
        let dir = plant(&[clean[0], clean[1], clean[2], clean[3], clean[4], clean[5], ("rl/env.rs", "//! Env.")]);
        let findings = check_crate(dir.path(), "src", &layers).unwrap();
        assert!(findings.iter().any(|f| f.contains("`rl/env` is in no layer")), "{findings:?}");
        // A member that names nothing.
        let layers = blocks("```layers src\nhigh: rl/train, rl/gone\nmid: rl/rows\nlow: engine\n```\n").remove(0).1;
        let dir = plant(&clean);
        let findings = check_crate(dir.path(), "src", &layers).unwrap();
        assert!(findings.iter().any(|f| f.contains("names `rl/gone`")), "{findings:?}");
    }

    /// A crate that depends on one of its own layer (or above) is found; a dev-dependency is not.
    #[test]
    fn crate_edges_go_down_only() {
        let dir = tempfile::tempdir().unwrap();
        let write = |rel: &str, text: &str| {
            let path = dir.path().join(rel);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(path, text).unwrap();
        };
        write("Cargo.toml", "[workspace]\nmembers = [\"trainer\", \"server\", \"leaf\"]\n");
        write("leaf/Cargo.toml", "[package]\nname = \"leaf\"\n");
        write(
            "server/Cargo.toml",
            "[package]\nname = \"server\"\n[dependencies]\nleaf.workspace = true\nserde = \"1\"\n",
        );
        let trainer = "[package]\nname = \"trainer\"\n[dependencies]\nleaf = { path = \"../leaf\" }\n\
                       [dev-dependencies]\nserver.workspace = true\n";
        write("trainer/Cargo.toml", trainer);
        let map = "```crate-layers\nprograms: trainer, server\nleaves: leaf\n```\n";
        let layers = crate_block(map).unwrap();
        assert_eq!(check_workspace(dir.path(), &layers).unwrap(), Vec::<String>::new());
        // The trainer takes the server as a normal dependency: a sideways edge.
        write("trainer/Cargo.toml", &trainer.replace("[dev-dependencies]\n", ""));
        let findings = check_workspace(dir.path(), &layers).unwrap();
        assert!(findings.iter().any(|f| f.contains("`trainer` (programs) has `server` (programs)")), "{findings:?}");
        // A leaf that reaches up, in a target-specific table.
        write("leaf/Cargo.toml", "[package]\nname = \"leaf\"\n[target.'cfg(unix)'.dependencies]\nserver = \"*\"\n");
        let findings = check_workspace(dir.path(), &layers).unwrap();
        assert!(findings.iter().any(|f| f.contains("`leaf` (leaves) has `server`")), "{findings:?}");
        // A member in no layer.
        let findings = check_workspace(
            dir.path(),
            &crate_block("```crate-layers\nprograms: trainer\nleaves: leaf\n```\n").unwrap(),
        )
        .unwrap();
        assert!(findings.iter().any(|f| f.contains("`server` is in no layer")), "{findings:?}");
    }
}
