//! What never reaches a store, an export or the CLI's output: hidden keys
//! (policy `[context] hidden`, top level) and secret-looking keys (at any
//! depth of deps).
//!
//! A key is secret-looking when, split into words (at `_`, `-`, `.`,
//! spaces and lower-to-upper case changes) and compared case-insensitively,
//!
//! - one of its words is `token(s)`, `secret(s)`, `password(s)`, `passwd`,
//!   `passphrase`, `credential(s)`, `authorization`, `cookie(s)` or
//!   `bearer`; or
//! - two adjacent words are `api key`, `private key`, `access key`,
//!   `secret key`, `signing key` or `session key`; or
//! - the key written without separators contains `apikey`, `privatekey`,
//!   `accesskey`, `secret`, `password`, `credential` or `authorization`,
//!   or ends with `token` (`githubtoken`, `APIKEY`).
//!
//! So `api_key`, `OPENAI_API_KEY`, `githubToken`, `client_secret`,
//! `db-password`, `Authorization` and `credentials` are dropped, and
//! `input_tokens` is too (a false positive is a key not saved; a false
//! negative would be a secret on disk). `keyboard`, `author` and `monkey`
//! are kept.
//!
//! Scrubbing costs one pass over the value; it never changes the live deps
//! a run works on, only what is written or shown.

use serde_json::{Map, Value};

use super::record::{Entry, Event, Item, Record};
use crate::context::{ContextOp, ContextRules};

const SECRET_WORDS: &[&str] = &[
    "token",
    "tokens",
    "secret",
    "secrets",
    "password",
    "passwords",
    "passwd",
    "passphrase",
    "credential",
    "credentials",
    "authorization",
    "cookie",
    "cookies",
    "bearer",
];

const SECRET_PAIRS: &[(&str, &str)] = &[
    ("api", "key"),
    ("private", "key"),
    ("access", "key"),
    ("secret", "key"),
    ("signing", "key"),
    ("session", "key"),
];

const SECRET_PARTS: &[&str] = &[
    "apikey",
    "privatekey",
    "accesskey",
    "secret",
    "password",
    "credential",
    "authorization",
];

/// Whether `key` looks like it names a secret (see the module docs).
pub fn is_secret_key(key: &str) -> bool {
    let joined: String = key
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| c.to_ascii_lowercase())
        .collect();
    if SECRET_PARTS.iter().any(|part| joined.contains(part)) || joined.ends_with("token") {
        return true;
    }
    let words = words(key);
    words.iter().any(|w| SECRET_WORDS.contains(&w.as_str()))
        || words
            .windows(2)
            .any(|pair| SECRET_PAIRS.contains(&(pair[0].as_str(), pair[1].as_str())))
}

/// `key` split into lower-case words at separators and case changes.
fn words(key: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut previous_lower = false;
    for c in key.chars() {
        if !c.is_alphanumeric() {
            previous_lower = false;
            if !word.is_empty() {
                words.push(std::mem::take(&mut word));
            }
            continue;
        }
        if c.is_uppercase() && previous_lower && !word.is_empty() {
            words.push(std::mem::take(&mut word));
        }
        previous_lower = c.is_lowercase() || c.is_ascii_digit();
        word.extend(c.to_lowercase());
    }
    if !word.is_empty() {
        words.push(word);
    }
    words
}

/// Removes every secret-looking key from `value`, at any depth (inside
/// arrays too).
pub fn scrub_value(value: &mut Value) {
    match value {
        Value::Object(map) => scrub_map(map),
        Value::Array(items) => items.iter_mut().for_each(scrub_value),
        _ => {}
    }
}

fn scrub_map(map: &mut Map<String, Value>) {
    map.retain(|key, _| !is_secret_key(key));
    map.values_mut().for_each(scrub_value);
}

/// Whether a top-level deps key is never stored or shown: hidden by the
/// policy, or secret-looking.
pub fn is_private_key(key: &str, rules: &ContextRules) -> bool {
    rules.is_hidden(key) || is_secret_key(key)
}

/// `deps` as it may be stored or shown: hidden and secret-looking keys
/// removed (secret-looking ones at any depth).
pub fn scrub_deps(deps: &Map<String, Value>, rules: &ContextRules) -> Map<String, Value> {
    deps.iter()
        .filter(|(key, _)| !is_private_key(key, rules))
        .map(|(key, value)| {
            let mut value = value.clone();
            scrub_value(&mut value);
            (key.clone(), value)
        })
        .collect()
}

/// A call's ops as they may be stored or shown: ops on hidden or
/// secret-looking keys dropped, secret-looking keys removed from the rest
/// of the values. Replaying the result on scrubbed deps gives the scrubbed
/// deps the original ops gave (an op names one top-level key, and a key
/// that is dropped is dropped everywhere).
pub fn scrub_ops(ops: &[ContextOp], rules: &ContextRules) -> Vec<ContextOp> {
    ops.iter()
        .filter(|op| !is_private_key(op.key(), rules))
        .map(|op| {
            let mut op = op.clone();
            match &mut op {
                ContextOp::Set { value, .. }
                | ContextOp::Merge { value, .. }
                | ContextOp::Append { value, .. } => scrub_value(value),
                ContextOp::Delete { .. } => {}
            }
            op
        })
        .collect()
}

/// `record` as it may be stored or shown: its deps scrubbed, its context
/// update's ops scrubbed.
pub fn scrub_record(mut record: Record, rules: &ContextRules) -> Record {
    match &mut record.entry {
        Entry::Deps { deps } => *deps = scrub_deps(deps, rules),
        Entry::Event { event, .. } | Entry::Item { event, .. } => scrub_event(event, rules),
        Entry::Message { .. } | Entry::Usage { .. } => {}
    }
    record
}

/// Scrubs a context update's ops in place (other items hold no deps).
pub fn scrub_event(event: &mut Event, rules: &ContextRules) {
    if let Item::ContextUpdate { ops, .. } = &mut event.item {
        *ops = scrub_ops(ops, rules);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_looking_keys() {
        for key in [
            "api_key",
            "API_KEY",
            "OPENAI_API_KEY",
            "apiKey",
            "x-api-key",
            "apikey",
            "token",
            "access_token",
            "githubToken",
            "GITHUBTOKEN",
            "refresh-token",
            "secret",
            "client_secret",
            "clientSecret",
            "password",
            "db_password",
            "Passwd",
            "authorization",
            "Authorization",
            "credential",
            "credentials",
            "aws_credentials",
            "private_key",
            "privateKey",
            "ssh_private_key",
            "session_key",
            "cookie",
        ] {
            assert!(is_secret_key(key), "{key} should look secret");
        }
        for key in [
            "counters",
            "notes",
            "keyboard",
            "author",
            "monkey",
            "keys",
            "user",
            "tokenizer",
            "history",
            "passage",
            "session_id",
        ] {
            assert!(!is_secret_key(key), "{key} should not look secret");
        }
    }

    #[test]
    fn scrubbing_reaches_every_depth() {
        let mut value = serde_json::json!({
            "a": {"b": [{"password": 1, "keep": 2}], "Token": "x"},
            "list": [[{"api_key": "k"}]],
        });
        scrub_value(&mut value);
        assert_eq!(
            value,
            serde_json::json!({"a": {"b": [{"keep": 2}]}, "list": [[{}]]})
        );
    }
}
