//! Checks of the docs against the tree: every repository path that
//! docs/architecture.md names exists, and what it says of the code holds:
//! no two files of a crate take names from each other.

use std::path::Path;

/// Top-level folders whose paths the docs name.
const ROOTS: &[&str] = &[
    "bpf/",
    "profiler/",
    "controller/",
    "vmm-patch/",
    "proto/",
    "xtask/",
    "benches/",
    "docs/",
];

/// Repository paths in `text`: words starting with a top-level folder.
/// A path ending in `-...` names the files that start with it.
pub fn paths(text: &str) -> Vec<String> {
    text.split(|c: char| c.is_whitespace() || matches!(c, '`' | '(' | ')' | ',' | '|'))
        .map(|w| w.trim_end_matches([':', ';']))
        // A sentence's full stop, but not a prefix's `-...`.
        .map(|w| match w.ends_with("-...") {
            true => w,
            false => w.trim_end_matches('.'),
        })
        .filter(|w| ROOTS.iter().any(|r| w.starts_with(r)))
        .map(str::to_string)
        .collect()
}

/// The paths of `text` that do not exist under `root`.
pub fn missing(text: &str, root: &Path) -> Vec<String> {
    paths(text)
        .into_iter()
        .filter(|p| {
            match p
                .strip_suffix("-...")
                .or_else(|| p.find(['*', '{']).map(|i| &p[..i]))
            {
                // A prefix (`0001-...`) or a pattern (`*.toml`, `{a,b}`): some
                // file must start with the part before it.
                Some(prefix) => {
                    let full = root.join(prefix);
                    let (Some(dir), Some(stem)) = (full.parent(), full.file_name()) else {
                        return true;
                    };
                    let stem = stem.to_string_lossy().into_owned();
                    !std::fs::read_dir(dir).is_ok_and(|mut d| {
                        d.any(|e| {
                            e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with(&stem))
                        })
                    })
                }
                None => !root.join(p).exists(),
            }
        })
        .collect()
}

/// Module path of a source file under a crate's `src` (`a/b.rs` and
/// `a/b/mod.rs` are `a::b`; lib.rs and main.rs are the root).
fn module_of(rel: &Path) -> Vec<String> {
    let mut parts: Vec<String> = rel
        .with_extension("")
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

fn rust_files(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    for e in rd.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Pairs of modules of the crate whose sources are in `src` that each
/// name the other through `super::` or `crate::` paths (code only: comments
/// and `#[cfg(test)]` modules do not count; a module and its own parent or
/// child are not a pair).
pub fn import_circles(src: &Path) -> Vec<(String, String)> {
    use std::collections::{BTreeMap, BTreeSet};
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let mods: BTreeMap<Vec<String>, std::path::PathBuf> = files
        .iter()
        .filter_map(|f| Some((module_of(f.strip_prefix(src).ok()?), f.clone())))
        .collect();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (m, f) in &mods {
        let Ok(text) = std::fs::read_to_string(f) else {
            continue;
        };
        let code = text.split("#[cfg(test)]").next().unwrap_or("");
        for line in code.lines() {
            let line = line.split("//").next().unwrap_or("");
            for (kw, start) in [("super::", true), ("crate::", false)] {
                for (i, _) in line.match_indices(kw) {
                    let path = &line[i + kw.len()..];
                    let mut target: Vec<String> = if start {
                        m[..m.len().saturating_sub(1)].to_vec()
                    } else {
                        Vec::new()
                    };
                    for seg in path.split("::") {
                        let seg: String = seg
                            .chars()
                            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                            .collect();
                        let mut next = target.clone();
                        next.push(seg);
                        if !mods.contains_key(&next) {
                            break;
                        }
                        target = next;
                    }
                    if &target != m && !target.is_empty() {
                        edges.entry(m.clone()).or_default().insert(target);
                    }
                }
            }
        }
    }
    let mut out = Vec::new();
    for (a, targets) in &edges {
        for b in targets {
            let related = a.starts_with(b) || b.starts_with(a);
            if a < b && !related && edges.get(b).is_some_and(|t| t.contains(a)) {
                out.push((a.join("::"), b.join("::")));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn root() -> &'static Path {
        Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap()
    }

    #[test]
    fn architecture_doc_names_only_files_that_exist() {
        let doc = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
        let named = paths(&doc);
        assert!(named.len() >= 30, "{named:?}");
        assert_eq!(missing(&doc, root()), Vec::<String>::new());
    }

    /// Every repository path any markdown doc of ours names exists (the
    /// README, docs/, the READMEs beside the code), and so does every one
    /// the BPF sources' comments name.
    #[test]
    fn every_doc_names_only_files_that_exist() {
        let mut docs: Vec<std::path::PathBuf> = ["README.md", "bpf/README.md", "benches/README.md"]
            .iter()
            .map(|p| root().join(p))
            .collect();
        for dir in ["docs", "vmm-patch"] {
            for e in walkdir(&root().join(dir)) {
                if e.extension().is_some_and(|x| x == "md") {
                    docs.push(e);
                }
            }
        }
        // The BPF sources' comments point into the loader.
        for e in walkdir(&root().join("bpf")) {
            if e.extension().is_some_and(|x| x == "c" || x == "h") && !e.ends_with("vmlinux.h") {
                docs.push(e);
            }
        }
        let mut bad = Vec::new();
        for d in &docs {
            let text = std::fs::read_to_string(d).unwrap();
            for m in missing(&text, root()) {
                bad.push(format!(
                    "{}: {m}",
                    d.strip_prefix(root()).unwrap().display()
                ));
            }
        }
        assert!(docs.len() >= 30, "{docs:?}");
        assert_eq!(bad, Vec::<String>::new());
    }

    /// Files under `dir`, recursively, skipping build output.
    fn walkdir(dir: &Path) -> Vec<std::path::PathBuf> {
        let mut out = Vec::new();
        let Ok(rd) = std::fs::read_dir(dir) else {
            return out;
        };
        for e in rd.flatten() {
            let p = e.path();
            if p.is_dir() {
                if p.file_name().is_some_and(|n| n != "target") {
                    out.extend(walkdir(&p));
                }
            } else {
                out.push(p);
            }
        }
        out
    }

    /// Code points at docs, not at issue numbers a reader of the
    /// repository cannot open.
    #[test]
    fn code_names_no_issue_numbers() {
        let mut files = Vec::new();
        for dir in [
            "bpf",
            "profiler",
            "controller",
            "vmm-patch",
            "proto",
            "xtask",
            "benches",
        ] {
            files.extend(walkdir(&root().join(dir)).into_iter().filter(|p| {
                p.extension().is_some_and(|x| {
                    ["rs", "c", "h", "proto", "toml"].contains(&&*x.to_string_lossy())
                })
            }));
        }
        let issue = ["issue", " "].concat();
        let mut found = Vec::new();
        for f in &files {
            let Ok(text) = std::fs::read_to_string(f) else {
                continue;
            };
            for (n, line) in text.lines().enumerate() {
                let lower = line.to_lowercase();
                if lower.match_indices(&issue).any(|(i, _)| {
                    lower[i + issue.len()..].starts_with(|c: char| c.is_ascii_digit())
                }) {
                    found.push(format!(
                        "{}:{}",
                        f.strip_prefix(root()).unwrap().display(),
                        n + 1
                    ));
                }
            }
        }
        assert!(files.len() > 300, "{}", files.len());
        assert_eq!(found, Vec::<String>::new());
    }

    /// Commit subjects since the rule began fit 72 columns, as
    /// cloud-hypervisor's gitlint asks: `git log --oneline` and
    /// `git shortlog` stay readable. Older commits are left as they are.
    #[test]
    fn commit_subjects_fit_72_columns() {
        const SINCE: &str = "a67dbfc";
        let out = std::process::Command::new("git")
            .args(["log", "--format=%h %s", &format!("{SINCE}..HEAD")])
            .current_dir(root())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "git log {SINCE}..HEAD (a clone with its history is needed): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let long: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| {
                l.split_once(' ')
                    .is_some_and(|(_, s)| s.chars().count() > 72)
            })
            .map(str::to_string)
            .collect();
        assert_eq!(long, Vec::<String>::new(), "subjects over 72 characters");
    }

    /// Every crate of the workspace: data flows one way between its files.
    #[test]
    fn no_two_files_of_a_crate_import_from_each_other() {
        let mut crates = 0;
        let mut circles = Vec::new();
        let mut dirs = vec![root().to_path_buf()];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).unwrap().flatten() {
                let p = e.path();
                let name = e.file_name().to_string_lossy().into_owned();
                if !p.is_dir() || name.starts_with('.') || name == "target" {
                    continue;
                }
                if name == "src" && d.join("Cargo.toml").is_file() {
                    crates += 1;
                    for (a, b) in import_circles(&p) {
                        circles.push(format!("{}: {a} <-> {b}", p.display()));
                    }
                } else {
                    dirs.push(p);
                }
            }
        }
        assert!(crates >= 9, "found {crates} crates");
        assert_eq!(circles, Vec::<String>::new());
    }

    #[test]
    fn a_circle_is_found() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path();
        std::fs::write(src.join("lib.rs"), "mod a;\nmod b;\nmod c;\n").unwrap();
        std::fs::write(src.join("a.rs"), "use super::b::B;\npub struct A;\n").unwrap();
        std::fs::write(
            src.join("b.rs"),
            "use crate::a::A;\n// super::c::C is a comment\npub struct B;\n",
        )
        .unwrap();
        std::fs::write(
            src.join("c.rs"),
            "use super::b::B;\n#[cfg(test)]\nmod t { use super::super::a::A; }\n",
        )
        .unwrap();
        assert_eq!(
            import_circles(src),
            vec![("a".to_string(), "b".to_string())]
        );
    }

    #[test]
    fn a_missing_file_or_patch_prefix_is_reported() {
        let text = "see profiler/src/nope.rs, vmm-patch/patches/0999-..., and bpf/ept.bpf.c";
        assert_eq!(
            missing(text, root()),
            vec!["profiler/src/nope.rs", "vmm-patch/patches/0999-..."]
        );
        let text = "profiler/events/*.toml, profiler/nope/*.toml and docs/ci.md.";
        assert_eq!(missing(text, root()), vec!["profiler/nope/*.toml"]);
    }
}
