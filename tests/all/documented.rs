//! The reference lists what the code has: every error kind (the
//! library's and the command line's own), every key of the policy's
//! tables and every field of the commands' JSON output, read from the
//! sources, so that a new one cannot go undocumented.

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
fn every_error_kind_policy_key_and_json_field_the_code_has_is_in_the_reference() {
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
    // The policy's keys: the fields of each table it reads
    // (`deny_unknown_fields`: any other key is refused).
    for file in [
        "policy/mod.rs",
        "policy/mcp.rs",
        "policy/oci.rs",
        "policy/limits.rs",
        "retention.rs",
    ] {
        let source = std::fs::read_to_string(root().join("host/src").join(file)).unwrap();
        for key in policy_keys(&source) {
            // As a word of a name in backticks: `key`, `key = …`,
            // `[table] key`, `[mcp.key]`, `{ key, … }`.
            let documented = names.iter().any(|n| {
                n.match_indices(key.as_str()).any(|(at, _)| {
                    let word = |c: char| c.is_ascii_alphanumeric() || c == '_';
                    !n[..at].ends_with(word) && !n[at + key.len()..].starts_with(word)
                })
            });
            if !documented {
                missing.push(format!("policy key {key} ({file})"));
            }
        }
    }
    // The JSON fields the commands print: the keys of their `json!`
    // objects, and those inserted after.
    for key in json_fields() {
        let quoted = format!("\"{key}\"");
        if !names.iter().any(|n| n == &key || n.contains(&quoted)) {
            missing.push(format!("JSON field {key}"));
        }
    }
    assert!(missing.is_empty(), "not in docs/reference.md: {missing:#?}");
}

/// The keys of the tables a policy is read into: the fields of each
/// struct marked `deny_unknown_fields`, under their serde names.
fn policy_keys(source: &str) -> Vec<String> {
    let mut keys = Vec::new();
    for (at, _) in source.match_indices("deny_unknown_fields") {
        let rest = &source[at..];
        let Some(open) = rest.find("struct ") else {
            continue;
        };
        let rest = &rest[open..];
        let (Some(start), Some(end)) = (rest.find('{'), rest.find("\n}")) else {
            continue;
        };
        let mut renamed: Option<String> = None;
        for line in rest[start + 1..end].lines() {
            let line = line.trim();
            if let Some(attribute) = line.strip_prefix("#[serde(") {
                if let Some((_, name)) = attribute.split_once("rename = \"") {
                    renamed = name.split('"').next().map(str::to_owned);
                }
                continue;
            }
            if line.starts_with("//") || line.starts_with('#') {
                continue;
            }
            if let Some((field, _)) = line.split_once(':') {
                let field = field
                    .trim()
                    .trim_start_matches("pub(crate) ")
                    .trim_start_matches("pub ");
                if !field.is_empty() && field.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                    keys.push(renamed.take().unwrap_or_else(|| field.to_owned()));
                }
            }
            renamed = None;
        }
    }
    keys
}

/// The keys of the JSON objects the commands print: each `"key":` inside
/// a `json!(...)` of the CLI's sources, and each `.insert("key"`.
fn json_fields() -> BTreeSet<String> {
    let mut fields = BTreeSet::new();
    for entry in std::fs::read_dir(root().join("host/src/cli")).unwrap() {
        let source = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        // Not the unit tests' JSON.
        let source = source.split("#[cfg(test)]").next().unwrap_or_default();
        for (at, _) in source.match_indices("json!(") {
            // The macro's text, to its closing parenthesis.
            let body = &source[at + "json!(".len()..];
            let mut depth = 1usize;
            let mut end = body.len();
            for (i, c) in body.char_indices() {
                match c {
                    '(' | '{' | '[' => depth += 1,
                    ')' | '}' | ']' => {
                        depth -= 1;
                        if depth == 0 {
                            end = i;
                            break;
                        }
                    }
                    _ => {}
                }
            }
            // JSON-RPC's own framing (`airlock mcp`'s errors) is MCP's.
            if body[..end].contains("\"jsonrpc\"") {
                continue;
            }
            for (at, _) in body[..end].match_indices("\":") {
                let before = &body[..at];
                if let Some(open) = before.rfind('"') {
                    let key = &before[open + 1..];
                    if !key.is_empty() && key.chars().all(|c| c.is_ascii_lowercase() || c == '_') {
                        fields.insert(key.to_owned());
                    }
                }
            }
        }
        for (at, _) in source.match_indices(".insert(\"") {
            let rest = &source[at + ".insert(\"".len()..];
            if let Some(end) = rest.find('"') {
                fields.insert(rest[..end].to_owned());
            }
        }
    }
    fields
}
