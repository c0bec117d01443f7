//! The house's rule, checked on every `cargo test`: each folder of `src/` is a layer, and a file
//! imports only from its own layer or the layers below it (the order is `LAYERS`, bottom
//! first, and `src/lib.rs` says what each owns). Within a folder, files import each other
//! without a circle, except the pairs in `ALLOWED_CIRCLES`, which are one thing in two files.
//!
//! The reader is deliberately small: it finds `crate::…` and `super::…` paths in code (comments
//! are skipped), expands `use` groups, and maps each path to the file that defines its longest
//! known module prefix.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Bottom first: a file in layer `i` may import layers `0..=i`.
const LAYERS: &[&str] = &[
    "base", "memory", "device", "engine", "quant", "model", "profile", "report", "app",
];

/// Circles allowed inside a folder, because the two files are one thing:
/// - a tensor frees its block through the runtime that made it, and the runtime makes tensors;
/// - the snapshot reader's pickle machine shapes PyTorch's entry and frame dicts into compact
///   structs (`raw`) while it decodes, so a million-entry trace never exists as a value tree,
///   and the shaping reads the machine's values.
const ALLOWED_CIRCLES: &[&[&str]] = &[
    &["engine::runtime", "engine::tensor"],
    &["report::snapshot::raw", "report::snapshot::unpickle"],
];

/// A module of the crate, as `a::b` (`""` for the crate root).
type Module = String;

struct Tree {
    /// Module → its source, comments removed.
    files: BTreeMap<Module, String>,
}

fn module_of(src: &Path, file: &Path) -> Option<Module> {
    let rel = file.strip_prefix(src).ok()?;
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop()?;
    let stem = last.strip_suffix(".rs")?;
    if !(stem == "mod" || (parts.is_empty() && (stem == "lib" || stem == "main"))) {
        parts.push(stem.to_string());
    }
    Some(parts.join("::"))
}

/// Removes `//` comments (line and doc) and `/* */` blocks, leaving string literals alone.
fn strip_comments(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = String::with_capacity(s.len());
    let mut i = 0;
    let mut in_str = false;
    while i < b.len() {
        let c = b[i];
        if in_str {
            out.push(c as char);
            if c == b'\\' && i + 1 < b.len() {
                out.push(b[i + 1] as char);
                i += 2;
                continue;
            }
            if c == b'"' {
                in_str = false;
            }
            i += 1;
        } else if b[i..].starts_with(b"r#\"") {
            // A raw string (the CUDA sources hold `extern "C"`): copied whole.
            let end = s[i + 3..].find("\"#").map_or(b.len(), |e| i + 3 + e + 2);
            out.push_str(&s[i..end]);
            i = end;
        } else if c == b'"' {
            in_str = true;
            out.push('"');
            i += 1;
        } else if c == b'\'' && i + 2 < b.len() && b[i + 2] == b'\'' {
            // A char literal such as '"' must not open a string.
            out.push_str("' '");
            i += 3;
        } else if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            i += 2;
            while i + 1 < b.len() && !b[i..].starts_with(b"*/") {
                i += 1;
            }
            i += 2;
        } else {
            // Non-ASCII bytes only occur in strings and comments in this code base; keep the
            // text valid by copying whole characters.
            let ch = s[i..].chars().next().unwrap();
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

impl Tree {
    fn read(src: &Path) -> Tree {
        let mut files = BTreeMap::new();
        let mut stack = vec![src.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for entry in std::fs::read_dir(&dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    if let Some(m) = module_of(src, &path) {
                        files.insert(m, strip_comments(&text));
                    }
                }
            }
        }
        Tree { files }
    }

    /// The file (module) that defines the longest known prefix of `path`.
    fn resolve(&self, path: &[String]) -> Option<Module> {
        (1..=path.len())
            .rev()
            .map(|n| path[..n].join("::"))
            .find(|m| self.files.contains_key(m))
    }
}

/// The paths a source text names from `crate::` or `super::`, as absolute segment lists.
fn paths_in(module: &str, text: &str) -> Vec<(usize, Vec<String>)> {
    let mut found = Vec::new();
    let b = text.as_bytes();
    let ident = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    let mut i = 0;
    while i < b.len() {
        let at_word = i == 0 || !ident(b[i - 1]);
        let base: Option<(usize, Vec<String>)> = if at_word && b[i..].starts_with(b"crate::") {
            Some((i + 7, Vec::new()))
        } else if at_word && b[i..].starts_with(b"super::") {
            // `super` of a file `a::b` is `a`; of `a/mod.rs` (module `a`) it is the crate root.
            let mut here: Vec<String> = module
                .split("::")
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect();
            let mut j = i;
            let mut ups = 0;
            while b[j..].starts_with(b"super::") {
                ups += 1;
                j += 7;
            }
            for _ in 0..ups {
                here.pop();
            }
            Some((j, here))
        } else {
            None
        };
        let Some((start, prefix)) = base else {
            i += 1;
            continue;
        };
        let line = text[..i].matches('\n').count() + 1;
        let (tails, end) = parse_tree(text, start);
        for tail in tails {
            let mut p = prefix.clone();
            p.extend(tail);
            found.push((line, p));
        }
        i = end.max(i + 1);
    }
    found
}

/// Parses a path tail (`a::b::c`, `a::{b, c::d}`, `{a, b}`) from `start`; returns each full
/// tail and where parsing stopped.
fn parse_tree(text: &str, start: usize) -> (Vec<Vec<String>>, usize) {
    let b = text.as_bytes();
    let mut i = start;
    let skip_ws = |i: &mut usize| {
        while *i < b.len() && b[*i].is_ascii_whitespace() {
            *i += 1;
        }
    };
    let mut segs = Vec::new();
    loop {
        skip_ws(&mut i);
        if i < b.len() && b[i] == b'{' {
            i += 1;
            let mut all = Vec::new();
            loop {
                skip_ws(&mut i);
                if i >= b.len() {
                    return (all, i);
                }
                if b[i] == b'}' {
                    i += 1;
                    break;
                }
                if b[i] == b',' {
                    i += 1;
                    continue;
                }
                let (subs, end) = parse_tree(text, i);
                for s in subs {
                    let mut p = segs.clone();
                    p.extend(s);
                    all.push(p);
                }
                if end == i {
                    i += 1;
                } else {
                    i = end;
                }
            }
            return (all, i);
        }
        let s = i;
        while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
            i += 1;
        }
        if i == s {
            break;
        }
        segs.push(text[s..i].to_string());
        if b[i..].starts_with(b"::") {
            i += 2;
        } else {
            break;
        }
    }
    (vec![segs], i)
}

fn layer_of(module: &str) -> Option<usize> {
    let top = module.split("::").next()?;
    LAYERS.iter().position(|l| *l == top)
}

#[derive(Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Edge {
    from: Module,
    to: Module,
    line: usize,
}

fn edges(tree: &Tree) -> Vec<Edge> {
    let mut out = BTreeSet::new();
    for (module, text) in &tree.files {
        for (line, path) in paths_in(module, text) {
            if let Some(to) = tree.resolve(&path) {
                if &to != module && !to.is_empty() {
                    out.insert(Edge {
                        from: module.clone(),
                        to,
                        line,
                    });
                }
            }
        }
    }
    out.into_iter().collect()
}

/// Imports that climb: from a layer to one above it, as `from:line -> to`.
fn climbing(tree: &Tree) -> Vec<String> {
    edges(tree)
        .into_iter()
        .filter_map(|e| {
            let (Some(a), Some(b)) = (layer_of(&e.from), layer_of(&e.to)) else {
                return None;
            };
            (b > a).then(|| {
                format!(
                    "{} (line {}) imports {}: layer `{}` is above `{}`",
                    e.from, e.line, e.to, LAYERS[b], LAYERS[a]
                )
            })
        })
        .collect()
}

/// Groups of files that import each other in a circle (strongly connected, more than one
/// file), leaving out a folder's `mod.rs` importing its own rooms (re-exports) and the allowed
/// pairs.
fn circles(tree: &Tree) -> Vec<Vec<Module>> {
    let mut graph: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    let all = edges(tree);
    for e in &all {
        let parent_to_child = e.to.starts_with(&format!("{}::", e.from)) || e.from.is_empty();
        if !parent_to_child {
            graph.entry(&e.from).or_default().insert(&e.to);
        }
    }
    let reach = |from: &str| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from];
        while let Some(n) = stack.pop() {
            for &m in graph.get(n).into_iter().flatten() {
                if seen.insert(m) {
                    stack.push(m);
                }
            }
        }
        seen
    };
    let reaches: BTreeMap<&str, BTreeSet<&str>> =
        tree.files.keys().map(|m| (m.as_str(), reach(m))).collect();
    let mut groups: Vec<Vec<Module>> = Vec::new();
    let mut placed = BTreeSet::new();
    for m in tree.files.keys() {
        if placed.contains(m.as_str()) {
            continue;
        }
        let group: Vec<Module> = tree
            .files
            .keys()
            .filter(|n| {
                *n == m
                    || (reaches[m.as_str()].contains(n.as_str())
                        && reaches[n.as_str()].contains(m.as_str()))
            })
            .cloned()
            .collect();
        if group.len() > 1 {
            for n in &group {
                placed.insert(n.clone());
            }
            let allowed = ALLOWED_CIRCLES
                .iter()
                .any(|a| a.len() == group.len() && a.iter().all(|x| group.iter().any(|g| g == x)));
            if !allowed {
                groups.push(group);
            }
        }
    }
    groups
}

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn every_top_level_module_is_a_known_layer() {
    let tree = Tree::read(&src_dir());
    let unknown: BTreeSet<&str> = tree
        .files
        .keys()
        .filter(|m| !m.is_empty())
        .map(|m| m.split("::").next().unwrap())
        .filter(|top| !LAYERS.contains(top))
        .collect();
    assert!(
        unknown.is_empty(),
        "modules outside the layers: {unknown:?} (add a folder to LAYERS, in its place)"
    );
}

#[test]
fn no_import_climbs_a_layer() {
    let bad = climbing(&Tree::read(&src_dir()));
    assert!(bad.is_empty(), "imports that climb:\n{}", bad.join("\n"));
}

#[test]
fn no_circles_between_files() {
    let bad = circles(&Tree::read(&src_dir()));
    assert!(
        bad.is_empty(),
        "files that import each other in a circle: {bad:?}"
    );
}

/// A small tree written to a temporary folder.
fn fake_tree(files: &[(&str, &str)]) -> (tempfile::TempDir, Tree) {
    let dir = tempfile::tempdir().unwrap();
    for (path, text) in files {
        let p = dir.path().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    let tree = Tree::read(dir.path());
    (dir, tree)
}

#[test]
fn a_climbing_import_is_caught() {
    let (_dir, tree) = fake_tree(&[
        ("lib.rs", "pub mod device;\npub mod model;\n"),
        ("device/mod.rs", "pub mod cuda;\n"),
        (
            "device/cuda.rs",
            "// crate::model::Config in a comment is not an import\nuse crate::model::config::Config;\n",
        ),
        ("model/mod.rs", "pub mod config;\n"),
        ("model/config.rs", "pub struct Config;\n"),
    ]);
    let bad = climbing(&tree);
    assert_eq!(bad.len(), 1, "{bad:?}");
    assert!(
        bad[0].starts_with("device::cuda (line 2) imports model::config"),
        "{bad:?}"
    );
}

#[test]
fn a_climbing_import_inside_a_use_group_or_through_super_is_caught() {
    let (_dir, tree) = fake_tree(&[
        ("lib.rs", ""),
        ("base/mod.rs", "pub mod units;\n"),
        ("base/units.rs", "use super::super::engine::ops;\n"),
        ("engine/mod.rs", "pub mod ops;\n"),
        (
            "engine/ops.rs",
            "use crate::{base::units, report::{png, csv::Csv}};\n",
        ),
        ("report/mod.rs", ""),
        ("report/png.rs", ""),
        ("report/csv.rs", ""),
    ]);
    let bad = climbing(&tree);
    assert_eq!(bad.len(), 3, "{bad:?}");
    assert!(bad
        .iter()
        .any(|b| b.starts_with("base::units (line 1) imports engine::ops")));
    assert!(bad
        .iter()
        .any(|b| b.starts_with("engine::ops (line 1) imports report::png")));
    assert!(bad
        .iter()
        .any(|b| b.starts_with("engine::ops (line 1) imports report::csv")));
}

#[test]
fn importing_downward_is_allowed() {
    let (_dir, tree) = fake_tree(&[
        ("lib.rs", ""),
        (
            "app/cli.rs",
            "use crate::report::png;\nuse crate::base::units::fmt;\n",
        ),
        ("report/png.rs", "use crate::base::units;\n"),
        ("base/units.rs", ""),
    ]);
    assert!(climbing(&tree).is_empty());
}

#[test]
fn a_circle_inside_a_folder_is_caught() {
    let (_dir, tree) = fake_tree(&[
        ("lib.rs", ""),
        (
            "model/mod.rs",
            "pub use llama::Llama;\npub use sampler::Sampler;\n",
        ),
        ("model/llama.rs", "use super::sampler::Sampler;\n"),
        ("model/sampler.rs", "use crate::model::llama::Llama;\n"),
        ("model/config.rs", "use super::llama;\n"),
    ]);
    assert_eq!(
        circles(&tree),
        vec![vec![
            "model::llama".to_string(),
            "model::sampler".to_string()
        ]]
    );
}
