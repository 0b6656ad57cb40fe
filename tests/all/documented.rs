//! The reference lists what the code has: every error kind (the
//! library's and the command line's own) and every key of a `[[tool]]`
//! table, read from the sources, so that a new one cannot go undocumented.

use std::collections::BTreeSet;

use crate::support::root;

/// The reference, and the names it shows in backticks.
fn documented() -> (String, BTreeSet<String>) {
    let text = std::fs::read_to_string(root().join("docs/reference.md")).unwrap();
    let names = text
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect();
    (text, names)
}

/// The string literals that follow `marker` in the CLI's sources (with
/// any whitespace between): the kinds its failures are made with.
fn cli_kinds(marker: &str) -> BTreeSet<String> {
    let mut kinds = BTreeSet::new();
    for entry in std::fs::read_dir(root().join("host/src/cli")).unwrap() {
        let source = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for (at, _) in source.match_indices(marker) {
            let rest = source[at + marker.len()..].trim_start();
            if let Some(literal) = rest.strip_prefix('"')
                && let Some(end) = literal.find('"')
            {
                kinds.insert(literal[..end].to_owned());
            }
        }
    }
    kinds
}

/// The kinds the CLI maps library errors to, one match arm a line
/// (`LoadError::Read { .. } => "file_not_readable",`).
fn mapped_kinds() -> BTreeSet<String> {
    let mut kinds = BTreeSet::new();
    for entry in std::fs::read_dir(root().join("host/src/cli")).unwrap() {
        let source = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        for line in source.lines() {
            let line = line.trim();
            if let Some((arm, kind)) = line.split_once("=> \"")
                && arm.contains("Error::")
                && let Some(kind) = kind.strip_suffix("\",")
                && kind.chars().all(|c| c.is_ascii_lowercase() || c == '_')
            {
                kinds.insert(kind.to_owned());
            }
        }
    }
    kinds
}

#[test]
fn every_error_kind_and_tool_key_the_code_has_is_in_the_reference() {
    let (_, names) = documented();
    let mut missing: Vec<String> = Vec::new();
    for kind in airlock::ErrorKind::ALL {
        if !names.contains(kind.as_str()) {
            missing.push(format!("error kind {}", kind.as_str()));
        }
    }
    let mut cli = cli_kinds("Failure::input(");
    cli.extend(cli_kinds("kind: "));
    // And the kinds a library error maps to: `Error::Variant => "kind",`.
    cli.extend(mapped_kinds());
    for kind in cli {
        if !names.contains(&kind) {
            missing.push(format!("command-line error kind {kind}"));
        }
    }
    // The `[[tool]]` keys: the fields of the policy's `ToolFile`.
    let policy = std::fs::read_to_string(root().join("host/src/policy/mod.rs")).unwrap();
    let body = policy
        .split("struct ToolFile {")
        .nth(1)
        .and_then(|rest| rest.split("\n}").next())
        .unwrap();
    for line in body.lines() {
        let line = line.trim();
        if line.starts_with('#') || line.starts_with("//") {
            continue;
        }
        if let Some((field, _)) = line.split_once(':') {
            let key = field.trim();
            if !key.is_empty()
                && !names
                    .iter()
                    .any(|n| n == key || n.starts_with(&format!("{key} =")))
            {
                missing.push(format!("[[tool]] key {key}"));
            }
        }
    }
    assert!(missing.is_empty(), "not in docs/reference.md: {missing:#?}");
}
