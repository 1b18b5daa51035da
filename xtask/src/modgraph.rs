//! The module graph of the kernel crate, and the check that it has no
//! cycle: between top-level modules (`crate::a` and `crate::b` using each
//! other, directly or through others), and between sibling modules of one
//! directory module (`sm100::stage2` and `sm100::load`). Layers that use
//! each other cannot be read, tested or moved one at a time.
//!
//! The graph comes from the source text: every `crate::`, `super::` and
//! `self::` path outside comments, in `use` items (braced groups included)
//! and in expressions alike, resolved against the module the path sits in
//! (inline `mod name { .. }` blocks such as `mod tests` included) to the
//! longest prefix that names a module file. Test code counts: a layer whose
//! tests reach back up is still tangled.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// A module path from the crate root (`["sm100", "stage2"]`).
type Module = Vec<String>;

/// Edges between modules: user -> used (both module files).
pub type Graph = BTreeMap<Module, BTreeSet<Module>>;

/// The module path a source file defines, from its path relative to
/// `src/` (`lib.rs`, `a.rs`, `a/mod.rs`, `a/b.rs`).
fn module_of(rel: &str) -> Module {
    let rel = rel.trim_end_matches(".rs");
    let mut parts: Vec<String> = rel.split('/').map(str::to_string).collect();
    if parts.last().is_some_and(|p| p == "mod" || p == "lib") {
        parts.pop();
    }
    parts
}

/// The source text with comments and the contents of string and char
/// literals blanked out (lengths kept), so that paths in docs and strings
/// do not count.
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let mut block = 0usize;
    while i < b.len() {
        if block > 0 {
            if b[i..].starts_with(b"*/") {
                block -= 1;
                out.extend_from_slice(b"  ");
                i += 2;
            } else if b[i..].starts_with(b"/*") {
                block += 1;
                out.extend_from_slice(b"  ");
                i += 2;
            } else {
                out.push(if b[i] == b'\n' { b'\n' } else { b' ' });
                i += 1;
            }
        } else if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                out.push(b' ');
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            block = 1;
            out.extend_from_slice(b"  ");
            i += 2;
        } else if b[i] == b'"' {
            out.push(b'"');
            i += 1;
            while i < b.len() && b[i] != b'"' {
                let n = if b[i] == b'\\' { 2 } else { 1 };
                for _ in 0..n.min(b.len() - i) {
                    out.push(if b[i] == b'\n' { b'\n' } else { b' ' });
                    i += 1;
                }
            }
            out.push(b'"');
            i += 1;
        } else if b[i] == b'\'' && i + 2 < b.len() && (b[i + 2] == b'\'' || b[i + 1] == b'\\') {
            // A char literal ('x', '\n'); lifetimes ('a) are left alone.
            out.push(b'\'');
            i += 1;
            while i < b.len() && b[i] != b'\'' {
                i += if b[i] == b'\\' { 2 } else { 1 };
                out.push(b' ');
            }
            out.push(b'\'');
            i += 1;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    Path,
    Open,
    Close,
    Comma,
    Other,
}

fn tokens(code: &str) -> Vec<Tok> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        if c.is_ascii_alphabetic() || c == b'_' {
            let s = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push(Tok::Ident(code[s..i].to_string()));
            continue;
        }
        if b[i..].starts_with(b"::") {
            out.push(Tok::Path);
            i += 2;
            continue;
        }
        out.push(match c {
            b'{' => Tok::Open,
            b'}' => Tok::Close,
            b',' => Tok::Comma,
            c if c.is_ascii_whitespace() => {
                i += 1;
                continue;
            }
            _ => Tok::Other,
        });
        i += 1;
    }
    out
}

/// Reads a path tail after `::` at `toks[i]`: identifiers separated by `::`,
/// and braced groups of such tails. Pushes every full path (prefix
/// included) onto `out`; returns the index after the tail.
fn read_tail(toks: &[Tok], mut i: usize, prefix: &[String], out: &mut Vec<Vec<String>>) -> usize {
    let mut path = prefix.to_vec();
    loop {
        match toks.get(i) {
            Some(Tok::Ident(s)) => {
                path.push(s.clone());
                i += 1;
                if toks.get(i) == Some(&Tok::Path) {
                    i += 1;
                    continue;
                }
                out.push(path);
                return i;
            }
            Some(Tok::Open) => {
                i += 1;
                loop {
                    match toks.get(i) {
                        Some(Tok::Close) => return i + 1,
                        Some(Tok::Comma) => i += 1,
                        None => return i,
                        _ => {
                            let j = read_tail(toks, i, &path, out);
                            // Skip `as name` and anything else up to , or }.
                            i = j.max(i + 1);
                            while !matches!(toks.get(i), Some(Tok::Comma | Tok::Close) | None) {
                                i += 1;
                            }
                        }
                    }
                }
            }
            _ => {
                // `*` or the end of the path.
                out.push(path);
                return i;
            }
        }
    }
}

/// Every module-relative path (`crate::`, `super::`, `self::`) in one
/// file, resolved to an absolute path from the crate root.
fn paths_in(module: &Module, src: &str) -> Vec<(Module, Vec<String>)> {
    let toks = tokens(&code_only(src));
    let mut out = Vec::new();
    // Inline modules: (name, brace depth inside them).
    let mut inline: Vec<(String, usize)> = Vec::new();
    let mut depth = 0usize;
    let mut i = 0;
    while i < toks.len() {
        match &toks[i] {
            Tok::Open => depth += 1,
            Tok::Close => {
                if inline.last().is_some_and(|m| m.1 == depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
            }
            Tok::Ident(k) if k == "mod" => {
                if let (Some(Tok::Ident(name)), Some(Tok::Open)) =
                    (toks.get(i + 1), toks.get(i + 2))
                {
                    inline.push((name.clone(), depth + 1));
                }
            }
            Tok::Ident(k) if k == "crate" || k == "super" || k == "self" => {
                let after_path = i > 0 && toks[i - 1] == Tok::Path;
                if !after_path && toks.get(i + 1) == Some(&Tok::Path) {
                    let here: Module = module
                        .iter()
                        .cloned()
                        .chain(inline.iter().map(|m| m.0.clone()))
                        .collect();
                    let mut base: Vec<String> = if k == "crate" {
                        Vec::new()
                    } else {
                        here.clone()
                    };
                    let mut j = i;
                    // `super::super::...`, `self::super::...`
                    while let Some(Tok::Ident(s)) = toks.get(j) {
                        if toks.get(j + 1) != Some(&Tok::Path) {
                            break;
                        }
                        match s.as_str() {
                            "super" => {
                                base.pop();
                            }
                            "self" | "crate" => {}
                            _ => break,
                        }
                        j += 2;
                    }
                    let mut found = Vec::new();
                    let end = read_tail(&toks, j, &base, &mut found);
                    out.extend(found.into_iter().map(|p| (here.clone(), p)));
                    i = end;
                    continue;
                }
            }
            _ => {}
        }
        i += 1;
    }
    out
}

/// The longest prefix of `path` that is a module file.
fn owner(modules: &BTreeSet<Module>, path: &[String]) -> Module {
    (0..=path.len())
        .rev()
        .map(|n| path[..n].to_vec())
        .find(|p| modules.contains(p))
        .unwrap_or_default()
}

/// The module graph of the files given as (path relative to `src/`, text).
pub fn graph(files: &[(String, String)]) -> Graph {
    let modules: BTreeSet<Module> = files.iter().map(|(p, _)| module_of(p)).collect();
    let mut g = Graph::new();
    for (rel, src) in files {
        let m = module_of(rel);
        g.entry(m.clone()).or_default();
        for (here, path) in paths_in(&m, src) {
            let from = owner(&modules, &here);
            let to = owner(&modules, &path);
            if from != to {
                g.entry(from).or_default().insert(to);
            }
        }
    }
    g
}

/// One cycle (a path that comes back to its start) among `nodes` under
/// `edges`, if there is one.
fn find_cycle(edges: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn dfs(
        n: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(n.to_string(), 1);
        stack.push(n.to_string());
        for m in edges.get(n).into_iter().flatten() {
            match state.get(m.as_str()).copied().unwrap_or(0) {
                1 => {
                    let at = stack.iter().position(|s| s == m).unwrap();
                    let mut c = stack[at..].to_vec();
                    c.push(m.clone());
                    return Some(c);
                }
                0 => {
                    if let Some(c) = dfs(m, edges, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(n.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for n in edges.keys() {
        if state.get(n).copied().unwrap_or(0) == 0 {
            let mut stack = Vec::new();
            if let Some(c) = dfs(n, edges, &mut state, &mut stack) {
                return Some(c);
            }
        }
    }
    None
}

/// The cycles of `g`: at most one per level (the top-level modules, and the
/// children of each directory module), each as `a -> b -> a`.
pub fn cycles(g: &Graph) -> Vec<String> {
    // Parent module -> edges between its children (by child name).
    let mut levels: BTreeMap<Module, BTreeMap<String, BTreeSet<String>>> = BTreeMap::new();
    for (from, tos) in g {
        for to in tos {
            // The deepest common parent; both sides must lie strictly below it.
            let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
            if common >= from.len() || common >= to.len() {
                continue; // a module and its own ancestor or descendant
            }
            let level = levels.entry(from[..common].to_vec()).or_default();
            level
                .entry(from[common].clone())
                .or_default()
                .insert(to[common].clone());
        }
    }
    let mut out = Vec::new();
    for (parent, edges) in &levels {
        if let Some(c) = find_cycle(edges) {
            let at = if parent.is_empty() {
                "crate".to_string()
            } else {
                format!("crate::{}", parent.join("::"))
            };
            out.push(format!("in {at}: {}", c.join(" -> ")));
        }
    }
    out
}

/// Reads every `.rs` file under `src` (paths relative to it, `/`-separated).
pub fn read_tree(src: &Path) -> Result<Vec<(String, String)>, String> {
    fn walk(dir: &Path, base: &Path, out: &mut Vec<(String, String)>) -> Result<(), String> {
        let mut entries: Vec<_> = std::fs::read_dir(dir)
            .map_err(|e| format!("{}: {e}", dir.display()))?
            .filter_map(|e| e.ok())
            .map(|e| e.path())
            .collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                walk(&p, base, out)?;
            } else if p.extension().is_some_and(|e| e == "rs") {
                let rel = p
                    .strip_prefix(base)
                    .unwrap()
                    .to_string_lossy()
                    .replace('\\', "/");
                let text =
                    std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?;
                out.push((rel, text));
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(src, src, &mut out)?;
    Ok(out)
}

/// Fails when the kernel crate's modules use each other in a cycle.
pub fn check_kernel_crate(root: &Path) -> Result<(), String> {
    let files = read_tree(&root.join("kernels-gpu/src"))?;
    let c = cycles(&graph(&files));
    if c.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "module cycles in kernels-gpu/src:\n  {}",
            c.join("\n  ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(list: &[(&str, &str)]) -> Vec<(String, String)> {
        list.iter()
            .map(|(p, t)| (p.to_string(), t.to_string()))
            .collect()
    }

    fn m(s: &str) -> Module {
        s.split("::")
            .filter(|p| !p.is_empty())
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn paths_resolve_through_groups_super_and_inline_modules() {
        let f = files(&[
            ("lib.rs", "pub mod a; pub mod b; pub mod c;"),
            ("a/mod.rs", "mod x; mod y;"),
            (
                "a/x.rs",
                "use super::y::{self, Thing as T};\n\
                 use crate::{b::{One, two}, c};\n\
                 // use crate::nope::N;\n\
                 const S: &str = \"crate::nope::X\";\n\
                 #[cfg(test)] mod tests { use super::*; fn f() { super::super::y::g(); } }",
            ),
            ("a/y.rs", "fn g() { let _ = crate::c::K; }"),
            ("b.rs", ""),
            ("c.rs", ""),
        ]);
        let g = graph(&f);
        let to: Vec<Module> = g[&m("a::x")].iter().cloned().collect();
        assert_eq!(to, vec![m("a::y"), m("b"), m("c")]);
        assert_eq!(
            g[&m("a::y")].iter().cloned().collect::<Vec<_>>(),
            vec![m("c")]
        );
        assert!(cycles(&g).is_empty());
    }

    #[test]
    fn a_planted_top_level_cycle_is_found() {
        let f = files(&[
            ("lib.rs", "pub mod p; pub mod q; pub mod r;"),
            ("p.rs", "use crate::q::Q;"),
            ("q/mod.rs", "mod inner;"),
            ("q/inner.rs", "const _: u32 = crate::r::R;"),
            ("r.rs", "use crate::p::{P};"),
        ]);
        let c = cycles(&graph(&f));
        assert_eq!(c, vec!["in crate: p -> q -> r -> p".to_string()]);
    }

    #[test]
    fn a_planted_sibling_cycle_is_found() {
        let f = files(&[
            ("lib.rs", "pub mod s;"),
            ("s/mod.rs", "mod stage; mod load;"),
            ("s/stage.rs", "use super::load;\npub struct Ctx;"),
            ("s/load.rs", "use super::stage::Ctx;"),
        ]);
        let c = cycles(&graph(&f));
        assert_eq!(c, vec!["in crate::s: load -> stage -> load".to_string()]);
        // Parent and child using each other is not a sibling cycle.
        let f = files(&[
            ("lib.rs", "pub mod s;"),
            ("s/mod.rs", "mod w; use self::w::K;"),
            ("s/w.rs", "use super::H;"),
        ]);
        assert!(cycles(&graph(&f)).is_empty());
    }

    #[test]
    fn the_kernel_crate_has_no_module_cycles() {
        check_kernel_crate(&crate::util::repo_root()).unwrap();
    }
}
