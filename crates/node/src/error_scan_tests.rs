//! Errors say each cause once: a source scan of the node's and the rounds service's
//! error enums for a variant whose message prints the field it also chains as its
//! `source()`, so that a logged chain reads `database: X: X` (STYLE.md, rust-bitcoin).

use std::path::{Path, PathBuf};

/// Every Rust source under `dir`, recursively, as (path, text).
fn all_sources(dir: &Path, out: &mut Vec<(String, String)>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            all_sources(&path, out);
        } else if path.extension().is_some_and(|x| x == "rs") {
            out.push((
                path.display().to_string(),
                std::fs::read_to_string(&path).unwrap(),
            ));
        }
    }
}

/// The comma-separated parts of a tuple variant's fields, commas inside `<…>` or `(…)`
/// not counted.
fn tuple_fields(fields: &str) -> Vec<&str> {
    let (mut depth, mut start, mut out) = (0i32, 0, Vec::new());
    for (i, c) in fields.char_indices() {
        match c {
            '<' | '(' | '[' => depth += 1,
            '>' | ')' | ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&fields[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if !fields[start..].trim().is_empty() {
        out.push(&fields[start..]);
    }
    out
}

/// The names (`0`, `1`, `source`, …) of the variant's fields that are its source.
fn source_fields(lines: &[&str], j: usize) -> Vec<String> {
    let variant = lines[j];
    let mut sources = Vec::new();
    if let Some(open) = variant.find('(') {
        // A tuple variant, possibly split over lines by rustfmt.
        let mut text = variant[open + 1..].to_string();
        let mut k = j + 1;
        while text.matches('(').count() >= text.matches(')').count() && k < lines.len() {
            text.push_str(lines[k]);
            k += 1;
        }
        let body = text.rsplit_once(')').map_or(text.as_str(), |(b, _)| b);
        for (i, field) in tuple_fields(body).iter().enumerate() {
            if field.contains("#[source]") || field.contains("#[from]") {
                sources.push(i.to_string());
            }
        }
    } else if variant.ends_with('{') {
        let mut marked = false;
        for field in &lines[j + 1..] {
            if field.starts_with('}') {
                break;
            }
            if field.starts_with("#[source]") || field.starts_with("#[from]") {
                marked = true;
                continue;
            }
            if field.starts_with("///") || field.starts_with("#[") {
                continue;
            }
            if let Some((name, _)) = field.split_once(':') {
                let name = name.trim_start_matches("pub ").trim();
                if marked || name == "source" {
                    sources.push(name.to_string());
                }
                marked = false;
            }
        }
    }
    sources
}

/// The error variants (`file:line`) whose message prints a field that is also their source.
fn errors_that_print_their_source(file: &str, text: &str) -> Vec<String> {
    let lines: Vec<&str> = text.lines().map(str::trim).collect();
    let mut found = Vec::new();
    for (i, line) in lines.iter().enumerate() {
        if !line.starts_with("#[error(") || line.contains("transparent") {
            continue;
        }
        let mut j = i + 1;
        while j < lines.len() && (lines[j].starts_with("#[") || lines[j].starts_with("///")) {
            j += 1;
        }
        if j >= lines.len() {
            continue;
        }
        let printed =
            |f: &String| line.contains(&format!("{{{f}}}")) || line.contains(&format!("{{{f}:"));
        if source_fields(&lines, j).iter().any(printed) {
            found.push(format!("{file}:{}", i + 1));
        }
    }
    found
}

/// The crates whose errors are held to the rule: this one and the rounds service.
fn scanned_crates() -> Vec<PathBuf> {
    let here = Path::new(env!("CARGO_MANIFEST_DIR"));
    vec![here.join("src"), here.join("../rounds/src")]
}

#[test]
fn no_error_prints_the_cause_it_chains() {
    let mut files = Vec::new();
    for dir in scanned_crates() {
        all_sources(&dir, &mut files);
    }
    assert!(
        files.len() > 50,
        "the scan found the sources: {}",
        files.len()
    );
    let found: Vec<String> = files
        .iter()
        .flat_map(|(file, text)| errors_that_print_their_source(file, text))
        .collect();
    assert!(
        found.is_empty(),
        "these errors print the cause they also chain (a logged chain says it twice): {found:?}"
    );
}

#[test]
fn the_scan_finds_a_variant_that_prints_its_source() {
    let text = "#[error(\"payout: {0}\")]\n    Spend(#[from] X),\n\
                #[error(\"bind {addr}: {source}\")]\n    Bind {\n        addr: A,\n        source: E,\n    },\n\
                #[error(\"{0}: {1}\")]\n    Io(PathBuf, #[source] std::io::Error),\n\
                #[error(\"cannot bind {0}: {1:?}\")]\n    Bind(\n        Addr,\n        #[source] Box<dyn Error + Send>,\n    ),\n\
                #[error(\"payout\")]\n    Ok(#[from] X),\n\
                #[error(\"stored channel {0} is corrupt\")]\n    Corrupt(Id, #[source] serde_json::Error),";
    assert_eq!(
        errors_that_print_their_source("f", text),
        vec![
            "f:1".to_string(),
            "f:3".to_string(),
            "f:8".to_string(),
            "f:10".to_string()
        ]
    );
}
