//! Text from tools, models and servers on the operator's terminal.
//!
//! Whatever the CLI prints as text goes through [`shown`] (in
//! [`super::print_out`], [`super::print_error`] and the notes), so no
//! control sequence a guest writes (ESC, BEL, CR, the C1 controls, bidi
//! overrides) reaches the terminal to move the cursor, rewrite a line, set
//! the title or write the clipboard. Guest text embedded in one line of
//! output (a log record, an op key, a tool's name) also has its newlines
//! escaped ([`field`]), so it cannot forge a line of its own. JSON output
//! stays exact JSON: [`json`] only writes the characters serde_json leaves
//! raw as `\u` escapes, which denote the same string.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::Arc;

use airlock::sandbox::Asker;
use airlock::text::is_unsafe;
use airlock::{Answer, Asked};
use serde_json::Value;

/// `error:`, in clap's bold red when stderr is a terminal and colour is
/// wanted (`NO_COLOR` unset or empty; `CLICOLOR_FORCE` colours a pipe
/// too), plain otherwise.
pub fn error_label() -> &'static str {
    let set = |name: &str| std::env::var_os(name).is_some_and(|v| !v.is_empty() && v != "0");
    let colour = !set("NO_COLOR")
        && (set("CLICOLOR_FORCE") || std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if colour {
        "\x1b[1m\x1b[31merror:\x1b[0m"
    } else {
        "error:"
    }
}

fn escape(text: &str, keep: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !text.chars().any(|c| is_unsafe(c) && !keep(c)) {
        return Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        match c {
            c if !is_unsafe(c) || keep(c) => out.push(c),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c => {
                let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
            }
        }
    }
    Cow::Owned(out)
}

/// `text` with every unsafe character escaped except newlines and tabs.
pub fn shown(text: &str) -> Cow<'_, str> {
    escape(text, |c| c == '\n' || c == '\t')
}

/// `text` as a block that starts on a line already begun: its lines
/// after the first indented by `indent` spaces (a description, a string
/// result), unsafe characters escaped as [`shown`] does.
pub fn block(text: &str, indent: usize) -> String {
    let continued = format!("\n{}", " ".repeat(indent));
    shown(text.trim_end()).replace('\n', &continued)
}

/// `text` as part of one line: newlines escaped too.
pub fn field(text: &str) -> Cow<'_, str> {
    escape(text, |_| false)
}

/// serde_json text written so a terminal shows it ([`airlock::text::safe_json`]).
pub fn json(text: &str) -> Cow<'_, str> {
    airlock::text::safe_json(text)
}

/// `text` on one line (runs of white space folded), at most `max` bytes.
pub fn one_line(text: &str, max: usize) -> String {
    let flat: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    airlock::text::truncate(&flat, max)
}

/// A call's ops as `set counters, append notes`.
pub fn op_summary(ops: &[airlock::ContextOp]) -> String {
    let ops: Vec<String> = ops
        .iter()
        .map(|op| format!("{} {}", op.kind(), op.key()))
        .collect();
    ops.join(", ")
}

/// A question for the person at the terminal: it writes its prompt, reads
/// the answer and hands it to whoever asked. Blocking; run off the async
/// threads.
pub(super) type Question = Box<dyn FnOnce() + Send>;

/// Where a command that prints while it asks (`airlock run`) sends its
/// questions: the one task that writes its progress takes them in turn,
/// after every line already due, so a prompt never shares a line with the
/// progress and two prompts never run at once. `None`: asked here and now
/// (`airlock call` prints nothing meanwhile).
pub(super) type Desk = Option<tokio::sync::mpsc::UnboundedSender<Question>>;

/// Asks `prompt` (blocking, returning the answer) at `desk`; `fallback`
/// when nobody can answer (the terminal went away).
pub(super) async fn ask_at<T: Send + 'static>(
    desk: &Desk,
    prompt: impl FnOnce() -> T + Send + 'static,
    fallback: T,
) -> T {
    match desk {
        None => tokio::task::spawn_blocking(prompt)
            .await
            .unwrap_or(fallback),
        Some(desk) => {
            let (answer, answered) = tokio::sync::oneshot::channel();
            let question: Question = Box::new(move || {
                let _ = answer.send(prompt());
            });
            if desk.send(question).is_err() {
                return fallback;
            }
            answered.await.unwrap_or(fallback)
        }
    }
}

/// Who answers a tool's question in `airlock run` and `airlock call`: the
/// person at the terminal (the question, what the answer holds, then a JSON object on
/// one line; an empty line declines, end of input cancels), asked at
/// `desk`, or, without a terminal, nobody (`unavailable`, saying so).
pub(super) fn asker(desk: Desk) -> Asker {
    let terminal = std::io::IsTerminal::is_terminal(&std::io::stdin());
    Arc::new(move |asked: Asked| {
        if !terminal {
            return Box::pin(async {
                Answer::Unavailable {
                    why: "there is no terminal to ask on".into(),
                }
            });
        }
        let desk = desk.clone();
        Box::pin(async move { ask_at(&desk, move || ask_person(&asked), Answer::Cancel).await })
    })
}

/// Asks `asked` on the terminal until the answer fits the question (or
/// is nothing, or the end of input): one that is not JSON, or does not fit
/// the question's schema, is refused with why ([`airlock::tools::misfit`],
/// the check the tool's answer gets) and asked again.
fn ask_person(asked: &Asked) -> Answer {
    let required: Vec<&str> = asked
        .schema
        .get("required")
        .and_then(Value::as_array)
        .map(|names| names.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let fields: Vec<String> = asked
        .schema
        .get("properties")
        .and_then(Value::as_object)
        .map(|properties| {
            properties
                .iter()
                .map(|(name, schema)| {
                    let kind = schema.get("type").and_then(Value::as_str).unwrap_or("any");
                    let needed = if required.contains(&name.as_str()) {
                        ", required"
                    } else {
                        ""
                    };
                    format!("{} ({kind}{needed})", field(name))
                })
                .collect()
        })
        .unwrap_or_default();
    // The call compiled it before asking; should it not compile here,
    // the tool's own check still judges the answer.
    let fits = airlock::spec::compile_schema(&asked.schema).ok();
    let mut err = std::io::stderr();
    let _ = writeln!(
        err,
        "a tool asks: {}\n  answer with a JSON object of: {} (an empty line declines)",
        field(&asked.message),
        if fields.is_empty() {
            "anything".to_owned()
        } else {
            fields.join(", ")
        }
    );
    loop {
        let _ = write!(err, "answer: ");
        let _ = err.flush();
        let mut line = String::new();
        match std::io::stdin().read_line(&mut line) {
            Ok(0) | Err(_) => {
                let _ = writeln!(err);
                return Answer::Cancel;
            }
            Ok(_) if line.trim().is_empty() => return Answer::Decline,
            Ok(_) => {
                let why = match serde_json::from_str::<Value>(line.trim()) {
                    Err(_) => "it is not JSON".to_owned(),
                    Ok(content) => {
                        let misfit = match &fits {
                            Some(fits) => airlock::tools::misfit(&content, fits),
                            None if content.is_object() => None,
                            None => Some("it is not a JSON object".to_owned()),
                        };
                        match misfit {
                            None => return Answer::Accept { content },
                            Some(why) => why,
                        }
                    }
                };
                let _ = writeln!(err, "  that does not fit the question: {why}; try again");
            }
        }
    }
}

/// Whether a line typed at a `[y/N]` question says yes: `y` or `yes`, in
/// either case; anything else is no.
pub(super) fn says_yes(line: &str) -> bool {
    let answer = line.trim();
    answer.eq_ignore_ascii_case("y") || answer.eq_ignore_ascii_case("yes")
}

/// A progress report in words: `2 of 3: stroke 2 of 3`.
pub(super) fn progress(done: f64, total: Option<f64>, message: Option<&str>) -> String {
    let message = message.map(|m| field(m).into_owned());
    airlock::sandbox::Progress {
        done,
        total,
        message,
    }
    .to_string()
}

/// `n` things in words: `1 tool call`, `5 tool calls`.
pub fn counted(n: u64, thing: &str) -> String {
    if n == 1 {
        format!("1 {thing}")
    } else {
        format!("{n} {thing}s")
    }
}

/// Usage in words: `4 requests, 5 tool calls, 2163 input + 124 output
/// tokens` (`1 request`, `1 tool call`).
pub fn describe_usage(usage: &airlock::Usage) -> String {
    format!(
        "{}, {}, {} input + {} output tokens",
        counted(u64::from(usage.requests), "request"),
        counted(u64::from(usage.tool_calls), "tool call"),
        usage.input_tokens,
        usage.output_tokens
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_sequences_are_shown_not_acted_on() {
        assert_eq!(
            shown("a\x1b]52;c;cHduZWQ=\x07b\rc\nd\te\u{9b}f\u{202e}g"),
            "a\\u{1b}]52;c;cHduZWQ=\\u{7}b\\rc\nd\te\\u{9b}f\\u{202e}g"
        );
        assert_eq!(field("x\ny: forged"), "x\\ny: forged");
        assert!(matches!(shown("plain é ✓"), Cow::Borrowed(_)));
    }

    #[test]
    fn yes_is_y_or_yes_in_either_case_and_nothing_else() {
        for yes in ["y", "Y", "yes", "YES", "Yes\n", "  y  "] {
            assert!(says_yes(yes), "{yes:?}");
        }
        for no in ["", "\n", "n", "no", "yep", "ye", "y es", "sure"] {
            assert!(!says_yes(no), "{no:?}");
        }
    }

    #[test]
    fn json_stays_the_same_json() {
        let value = serde_json::json!({"k\u{1b}": "\u{7f}\u{9b}2J\u{202e}\n"});
        let text = value.to_string();
        let safe = json(&text);
        assert!(!safe.chars().any(is_unsafe), "{safe}");
        assert_eq!(
            serde_json::from_str::<serde_json::Value>(&safe).unwrap(),
            value
        );
    }
}
