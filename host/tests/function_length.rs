//! No function in `host/src` is longer than [`MAX_LINES`] lines (from its
//! `fn` line to its closing brace, tests included), so that each path of
//! the library stays readable on its own. Prints the longest ones.
//!
//! Reads the sources at run time: where they are absent (the GPU bundle
//! copies test binaries without the tree) the check says so and passes.

use std::path::{Path, PathBuf};

/// The longest a function may be, in lines.
const MAX_LINES: usize = 120;

/// `src` with comments and the contents of string and character literals
/// blanked out (newlines kept), so that braces and `fn` in them do not
/// count.
fn code_only(src: &str) -> String {
    let c: Vec<char> = src.chars().collect();
    let mut out = String::with_capacity(src.len());
    let blank = |ch: char| if ch == '\n' { '\n' } else { ' ' };
    let ident = |ch: char| ch.is_alphanumeric() || ch == '_';
    let mut i = 0;
    while i < c.len() {
        let next = c.get(i + 1).copied();
        if c[i] == '/' && next == Some('/') {
            while i < c.len() && c[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c[i] == '/' && next == Some('*') {
            // Block comments nest in Rust.
            let mut depth = 0;
            loop {
                if c[i] == '/' && c.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if c[i] == '*' && c.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(c[i]));
                    i += 1;
                }
            }
        } else if c[i] == 'r'
            && matches!(next, Some('"' | '#'))
            && (i == 0 || !ident(c[i - 1]) || c[i - 1] == 'b')
        {
            // Raw string r#"..."#: ends at a quote followed by as many #.
            let mut j = i + 1;
            while c.get(j) == Some(&'#') {
                j += 1;
            }
            if c.get(j) != Some(&'"') {
                out.push(c[i]);
                i += 1;
                continue;
            }
            let hashes = j - i - 1;
            out.extend(std::iter::repeat_n(' ', j + 1 - i));
            i = j + 1;
            while i < c.len() && !(c[i] == '"' && (1..=hashes).all(|k| c.get(i + k) == Some(&'#')))
            {
                out.push(blank(c[i]));
                i += 1;
            }
            out.extend(std::iter::repeat_n(' ', hashes + 1));
            i += hashes + 1;
        } else if c[i] == '"' {
            out.push(' ');
            i += 1;
            while i < c.len() && c[i] != '"' {
                let n = if c[i] == '\\' { 2 } else { 1 };
                for k in 0..n {
                    out.push(blank(*c.get(i + k).unwrap_or(&' ')));
                }
                i += n;
            }
            out.push(' ');
            i += 1;
        } else if c[i] == '\'' && (next == Some('\\') || c.get(i + 2) == Some(&'\'')) {
            // A character literal ('x', '\n', '\u{..}'); otherwise a lifetime.
            let from = if next == Some('\\') { i + 3 } else { i + 2 };
            let end = (from..c.len())
                .find(|&k| c[k] == '\'')
                .unwrap_or(c.len() - 1);
            out.extend(std::iter::repeat_n(' ', end + 1 - i));
            i = end + 1;
        } else {
            out.push(c[i]);
            i += 1;
        }
    }
    out
}

/// `(lines, name, first line)` of every function with a body in `src`.
fn functions(src: &str) -> Vec<(usize, String, usize)> {
    let code = code_only(src);
    let lines: Vec<&str> = code.lines().collect();
    let mut found = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let words: Vec<&str> = line
            .split(|ch: char| !(ch.is_alphanumeric() || ch == '_'))
            .filter(|w| !w.is_empty())
            .collect();
        // `fn name`: a definition (`fn(` is a pointer type, no name).
        let Some(at) = words.iter().position(|&w| w == "fn") else {
            continue;
        };
        let Some(name) = words.get(at + 1) else {
            continue;
        };
        if !line.contains(&format!("fn {name}")) {
            continue;
        }
        let (mut depth, mut opened) = (0i32, false);
        'scan: for (end, l) in lines.iter().enumerate().skip(start) {
            for ch in l.chars() {
                match ch {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    // A declaration without a body.
                    ';' if !opened => break 'scan,
                    _ => {}
                }
                if opened && depth == 0 {
                    found.push((end - start + 1, name.to_string(), start + 1));
                    break 'scan;
                }
            }
        }
    }
    found
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

#[test]
fn no_host_function_is_longer_than_the_limit() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    if !src.is_dir() {
        println!(
            "function length: {} not present, not checked",
            src.display()
        );
        return;
    }
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut all = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let rel = f.strip_prefix(&src).unwrap().display().to_string();
        for (n, name, line) in functions(&text) {
            all.push((n, format!("src/{rel}:{line} {name}")));
        }
    }
    all.sort_by(|a, b| b.cmp(a));
    println!("longest functions in host/src (limit {MAX_LINES} lines):");
    for (n, at) in all.iter().take(8) {
        println!("{n:5} {at}");
    }
    let over: Vec<_> = all.iter().filter(|(n, _)| *n > MAX_LINES).collect();
    assert!(over.is_empty(), "longer than {MAX_LINES} lines: {over:?}");
}

#[test]
fn the_counter_skips_comments_strings_and_lifetimes() {
    let src = r##"
fn a<'x>(s: &'x str) -> char {
    // } not a brace
    let _ = "} {";
    let _ = r#"}"#;
    /* } /* nested } */ } */
    let _: fn(u8) = |_| {};
    let _ = '\'';
    '}'
}
trait T {
    fn decl(&self);
    fn with_body(&self) {}
}
"##;
    let f = functions(src);
    let names: Vec<_> = f.iter().map(|(n, name, _)| (name.as_str(), *n)).collect();
    assert_eq!(names, [("a", 9), ("with_body", 1)]);
}
