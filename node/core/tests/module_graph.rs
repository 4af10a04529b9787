//! The top-level modules of tally-core (`crdt`, `partition`, `replica`,
//! `storage`, ...) form no import circle: a module may use the ones below
//! it, never one that uses it back, so each can be read, tested and moved
//! without the others above it (issue 42: `store -> replica -> store` was
//! one circle while both lived in tally-node).
//!
//! The test reads the crate's sources from `src/lib.rs`, following every
//! `mod` declaration (with `#[path]`), so each file is known by its module
//! path; it collects every `crate::<module>` path (with `$crate::`, and
//! `super::` chains that reach the crate root), groups `{a, b}` included,
//! and fails on a circle, printing it with the lines that make each edge.
//!
//! Test code is left out: a module declared under `#[cfg(test)]` (and an
//! inline `#[cfg(test)] mod ... { }` block) is not part of the crate that
//! ships, and the replica's unit tests run it over `storage`'s in-memory
//! store, which `storage` -> `replica` makes an edge back by design.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// One source file, as the compiler loads it.
struct SourceFile {
    path: PathBuf,
    /// Its module path below the crate root (`["replica", "folds"]`).
    module: Vec<String>,
    /// Declared under `#[cfg(test)]`, itself or an ancestor.
    test_only: bool,
}

/// Removes comments (doc comments included: an intra-doc link is no
/// import) and the bodies of inline `#[cfg(test)]` modules.
fn code_of(text: &str) -> String {
    let without_comments: String = text
        .lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut code = without_comments;
    while let Some(at) = find_inline_test_module(&code) {
        let open = at + code[at..].find('{').expect("an inline module has a body");
        let close = matching_brace(&code, open);
        code.replace_range(at..=close, "");
    }
    code
}

/// Where an inline `#[cfg(test)] mod name {` starts, if there is one.
fn find_inline_test_module(code: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(found) = code[from..].find("#[cfg(test)]") {
        let at = from + found;
        let rest = code[at + "#[cfg(test)]".len()..].trim_start();
        let rest = rest.strip_prefix("pub(crate) ").unwrap_or(rest);
        if let Some(after_mod) = rest.strip_prefix("mod ") {
            let header: String = after_mod
                .chars()
                .take_while(|c| *c != ';' && *c != '{')
                .collect();
            if after_mod[header.len()..].starts_with('{') {
                return Some(at);
            }
        }
        from = at + 1;
    }
    None
}

/// The index of the `}` that closes the `{` at `open`.
fn matching_brace(code: &str, open: usize) -> usize {
    let mut depth = 0usize;
    for (index, c) in code[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return open + index;
                }
            }
            _ => {}
        }
    }
    panic!("unbalanced braces after byte {open}");
}

/// The `mod name;` declarations of `code`: name, `#[path]` if any, and
/// whether `#[cfg(test)]` is among its attributes.
fn declared_modules(code: &str) -> Vec<(String, Option<String>, bool)> {
    let mut found = Vec::new();
    let mut attributes: Vec<String> = Vec::new();
    for line in code.lines().map(str::trim) {
        if line.starts_with("#[") {
            attributes.push(line.to_string());
            continue;
        }
        let declaration = line
            .strip_prefix("pub ")
            .or_else(|| line.strip_prefix("pub(crate) "))
            .or_else(|| line.strip_prefix("pub(super) "))
            .unwrap_or(line);
        if let Some(name) = declaration
            .strip_prefix("mod ")
            .and_then(|rest| rest.strip_suffix(';'))
        {
            let path = attributes.iter().find_map(|attribute| {
                let value = attribute.strip_prefix("#[path = \"")?;
                Some(value.split('"').next()?.to_string())
            });
            let test = attributes.iter().any(|a| a == "#[cfg(test)]");
            found.push((name.trim().to_string(), path, test));
        }
        if !line.is_empty() {
            attributes.clear();
        }
    }
    found
}

/// Every source file of the crate rooted at `lib`, by following `mod`.
fn source_files(lib: &Path) -> Vec<SourceFile> {
    let mut files = Vec::new();
    let mut queue = vec![SourceFile {
        path: lib.to_path_buf(),
        module: Vec::new(),
        test_only: false,
    }];
    while let Some(file) = queue.pop() {
        let text = std::fs::read_to_string(&file.path)
            .unwrap_or_else(|error| panic!("{}: {error}", file.path.display()));
        let dir = file.path.parent().unwrap().to_path_buf();
        let name = file.path.file_stem().unwrap().to_str().unwrap();
        // lib.rs and mod.rs own their directory; `foo.rs` owns `foo/`.
        let owned = match name {
            "lib" | "mod" => dir.clone(),
            _ => dir.join(name),
        };
        for (child, path, test) in declared_modules(&code_of(&text)) {
            let path = match path {
                Some(path) => dir.join(path),
                None if owned.join(format!("{child}.rs")).exists() => {
                    owned.join(format!("{child}.rs"))
                }
                None => owned.join(&child).join("mod.rs"),
            };
            let mut module = file.module.clone();
            module.push(child);
            queue.push(SourceFile {
                path,
                module,
                test_only: file.test_only || test,
            });
        }
        files.push(file);
    }
    files
}

/// The top-level modules that `code`, in module `module`, names: through
/// `crate::` (or `$crate::`), or through enough `super::` to reach the root.
fn referenced_top_modules(code: &str, module: &[String]) -> Vec<String> {
    let mut found = Vec::new();
    let bytes = code.as_bytes();
    let word_start =
        |at: usize| at == 0 || !(bytes[at - 1].is_ascii_alphanumeric() || bytes[at - 1] == b'_');
    for (at, _) in code.match_indices("crate::") {
        if word_start(at) {
            found.extend(first_segments(&code[at + "crate::".len()..]));
        }
    }
    let mut at = 0;
    while let Some(found_at) = code[at..].find("super::") {
        let start = at + found_at;
        at = start + 1;
        if !word_start(start) || code[..start].ends_with("super::") {
            continue;
        }
        let mut rest = &code[start..];
        let mut levels = 0;
        while let Some(after) = rest.strip_prefix("super::") {
            levels += 1;
            rest = after;
        }
        if levels == module.len() {
            found.extend(first_segments(rest));
        }
    }
    found
}

/// The first path segment after `crate::`: one name, or each name of a
/// `{a, b::c}` group.
fn first_segments(rest: &str) -> Vec<String> {
    let ident = |text: &str| -> String {
        text.trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect()
    };
    if let Some(group) = rest.strip_prefix('{') {
        let inner = &group[..matching_brace(rest, 0) - 1];
        let mut names = Vec::new();
        let mut depth = 0;
        let mut item_start = 0;
        for (index, c) in inner.char_indices() {
            match c {
                '{' => depth += 1,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    names.push(ident(&inner[item_start..index]));
                    item_start = index + 1;
                }
                _ => {}
            }
        }
        names.push(ident(&inner[item_start..]));
        names.retain(|name| !name.is_empty() && name != "self");
        names
    } else {
        vec![ident(rest)]
    }
}

/// Edges between top-level modules, each with the files that make it.
type Graph = BTreeMap<String, BTreeMap<String, BTreeSet<String>>>;

fn module_graph(files: &[SourceFile]) -> Graph {
    let tops: BTreeSet<&str> = files
        .iter()
        .filter(|file| file.module.len() == 1)
        .map(|file| file.module[0].as_str())
        .collect();
    let mut graph = Graph::new();
    for file in files.iter().filter(|file| !file.test_only) {
        let Some(from) = file.module.first() else {
            continue; // lib.rs: declares the modules, names none
        };
        let code = code_of(&std::fs::read_to_string(&file.path).unwrap());
        for to in referenced_top_modules(&code, &file.module) {
            if &to != from && tops.contains(to.as_str()) {
                graph
                    .entry(from.clone())
                    .or_default()
                    .entry(to)
                    .or_default()
                    .insert(file.path.display().to_string());
            }
        }
    }
    graph
}

/// A circle of `graph`, as the modules along it, if there is one.
fn find_circle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|on_path| on_path == node) {
            let mut circle = path[at..].to_vec();
            circle.push(node.to_string());
            return Some(circle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in graph.get(node).into_iter().flat_map(BTreeMap::keys) {
            if let Some(circle) = visit(next, graph, path, done) {
                return Some(circle);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut Vec::new(), &mut done))
}

fn core_files() -> Vec<SourceFile> {
    source_files(&Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs"))
}

#[test]
fn the_top_level_modules_form_no_circle() {
    let graph = module_graph(&core_files());
    if let Some(circle) = find_circle(&graph) {
        let edges: Vec<String> = circle
            .windows(2)
            .map(|pair| {
                let files = &graph[&pair[0]][&pair[1]];
                format!("  {} -> {} in {files:?}", pair[0], pair[1])
            })
            .collect();
        panic!(
            "an import circle between tally-core's modules: {}\n{}",
            circle.join(" -> "),
            edges.join("\n")
        );
    }
}

#[test]
fn the_walk_finds_the_modules_and_the_edges_that_exist() {
    // A walk that found nothing would find no circle: check it sees what
    // is known to be there.
    let files = core_files();
    for module in [
        vec!["replica", "folds", "scoped"],
        vec!["storage", "encoding", "fold"],
    ] {
        assert!(
            files
                .iter()
                .any(|file| file.module == module && !file.test_only),
            "{module:?} not found"
        );
    }
    assert!(files
        .iter()
        .any(|file| file.module == ["replica", "retire", "tests"] && file.test_only));
    let graph = module_graph(&files);
    for (from, to) in [
        ("replica", "crdt"),
        ("replica", "partition"),
        ("storage", "replica"),
    ] {
        assert!(
            graph.get(from).is_some_and(|edges| edges.contains_key(to)),
            "no edge {from} -> {to}: {graph:?}"
        );
    }
}

#[test]
fn a_circle_is_found_through_crate_paths_groups_and_super_chains() {
    let module = |path: &[&str]| path.iter().map(|name| name.to_string()).collect::<Vec<_>>();
    assert_eq!(
        referenced_top_modules(
            "use crate::{crdt::Slot, partition::{Partition, PartitionSet}};",
            &module(&["replica", "folds"])
        ),
        ["crdt", "partition"]
    );
    assert_eq!(
        referenced_top_modules(
            "super::super::storage::MemoryStore",
            &module(&["replica", "folds"])
        ),
        ["storage"]
    );
    assert!(referenced_top_modules("super::Folds", &module(&["replica", "folds"])).is_empty());
    let mut graph = Graph::new();
    let edge = |graph: &mut Graph, from: &str, to: &str| {
        graph
            .entry(from.into())
            .or_default()
            .entry(to.into())
            .or_default();
    };
    edge(&mut graph, "replica", "crdt");
    edge(&mut graph, "storage", "replica");
    assert_eq!(find_circle(&graph), None);
    edge(&mut graph, "replica", "storage");
    assert_eq!(
        find_circle(&graph),
        Some(module(&["replica", "storage", "replica"]))
    );
}
