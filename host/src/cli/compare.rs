//! What `airlock replay` and `airlock pull --update --replay` share: the
//! sessions a selection names, their calls replayed against a host, and
//! the report (text and JSON).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use serde_json::{Value, json};

use airlock::Host;
use airlock::agent::replay::{CallBudget, Ended, Replay, ReplaySummary, Replayed, Verdict};
use airlock::session::{Session, SessionStore};

use super::terminal::{counted, field};
use super::{Failure, print_note};

/// The most differing paths a text diff lists per call.
const MAX_DIFF_LINES: usize = 12;

/// The most calls a report shows whole (each with its recorded and
/// replayed result and ops): past them, calls that are not the same are
/// counted, so that a replay in which every call of a large session
/// differs holds a bounded report, as it holds a bounded part of the
/// journal.
const MAX_SHOWN: usize = 1000;

/// The machine's cores: how many calls a replay runs at once by default.
pub(super) fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

/// Which sessions to replay: those named (the user's), or every session
/// of the user (of every user with `all_users`) updated within `since`.
pub(super) struct Selection<'a> {
    pub(super) sessions: &'a [String],
    pub(super) since: Option<&'a str>,
    pub(super) all_users: bool,
}

/// What a replay over several sessions found.
#[derive(Default)]
pub(super) struct Compared {
    pub(super) total: ReplaySummary,
    /// Each session: its owner, id and summary.
    per_session: Vec<(Option<String>, String, ReplaySummary)>,
    /// The calls that are not the same, in order: the first
    /// [`MAX_SHOWN`].
    reported: Vec<Replayed>,
    /// Calls not the same past those.
    not_shown: u64,
    /// Calls replayed per tool.
    pub(super) seen: BTreeMap<String, u64>,
}

/// A host with no tool yet, under `policy`'s context rules (those the
/// journal's ops were scrubbed with) and `[limits]` (what a candidate the
/// policy has no entry for runs with, by [`Host::load`]): where a
/// candidate is loaded.
pub(super) fn empty_host(policy: Option<&airlock::policy::Policy>) -> Result<Host, Failure> {
    let mut builder = super::host_builder(super::Lifetime::OneShot);
    if let Some(policy) = policy {
        builder = builder
            .context_rules(policy.context.clone())
            .limits(policy.limits.clone())
            .fuel_metering(policy.needs_fuel());
    }
    Ok(builder.build()?)
}

/// The most sessions a replay reads and folds at once. A session's
/// reader and fold are one task's work each, so a replay of many short
/// sessions one at a time keeps about one core busy whatever its
/// `parallel`; several at once (all their calls within one budget of
/// `parallel`) keep the cores busy, and two for each call at once keep
/// one session's calls running while the next is read (with one per call,
/// two cores were busy about 1.6 of the time; with two, 1.7). Each holds what
/// one session's replay holds (three pages of its journal, the calls
/// read ahead and up to [`MAX_SHOWN`] calls that differ), so this bounds
/// the replay's memory.
const SESSIONS_AT_ONCE: usize = 4;

/// Replays `tools` in each of `sessions` against `host`: up to
/// [`SESSIONS_AT_ONCE`] sessions at a time (two for each of `parallel`),
/// at most `parallel` calls at once in all (as [`CallBudget::new`]
/// bounds them), reported in `sessions`' order.
/// The first session that cannot be replayed ends it.
pub(super) async fn compare(
    store: &dyn SessionStore,
    host: &Arc<Host>,
    tools: &BTreeSet<String>,
    sessions: &[(Option<String>, String)],
    parallel: usize,
) -> Result<Compared, Failure> {
    use futures::StreamExt;
    let budget = &CallBudget::new(parallel);
    let at_once = parallel.saturating_mul(2).clamp(2, SESSIONS_AT_ONCE);
    let mut replays = futures::stream::iter(sessions)
        .map(|(user, session_id)| async move {
            let replay = Replay {
                owner: user.as_deref(),
                session_id,
                tools,
                parallel,
            };
            let mut part = Compared::default();
            let summary =
                Session::replay_within(store, host, replay, budget, |call| part.take(call)).await;
            (user, session_id, summary, part)
        })
        .buffered(at_once);
    let mut compared = Compared::default();
    while let Some((user, session_id, summary, part)) = replays.next().await {
        let summary = summary.map_err(|e| match e {
            airlock::agent::replay::ReplayError::Store(e) => {
                let whose = super::whose(user.as_deref());
                let mut failure = Failure::from(e);
                failure.message = format!("{} ({whose}) in {}", failure.message, store.location());
                failure
            }
            other => Failure::input("session_damaged", other.to_string()),
        })?;
        compared.add(part);
        compared.total.add(&summary);
        compared
            .per_session
            .push((user.clone(), session_id.clone(), summary));
    }
    Ok(compared)
}

impl Compared {
    /// Counts `call`, and keeps it for the report when it is not the same
    /// (the first [`MAX_SHOWN`] of those; the rest are counted).
    fn take(&mut self, call: Replayed) {
        *self.seen.entry(call.tool.clone()).or_default() += 1;
        if call.verdict == Verdict::Same {
            return;
        }
        if self.reported.len() < MAX_SHOWN {
            self.reported.push(call);
        } else {
            self.not_shown += 1;
        }
    }

    /// Adds what a later session's replay found (its calls counted and
    /// kept by [`Compared::take`]), keeping the first [`MAX_SHOWN`] of
    /// all.
    fn add(&mut self, later: Compared) {
        for (tool, n) in later.seen {
            *self.seen.entry(tool).or_default() += n;
        }
        let room = MAX_SHOWN.saturating_sub(self.reported.len());
        let kept = later.reported.len().min(room);
        self.not_shown += (later.reported.len() - kept) as u64 + later.not_shown;
        self.reported.extend(later.reported.into_iter().take(kept));
    }

    /// How many calls differ from their journal or fail.
    pub(super) fn differ(&self) -> u64 {
        self.total.different + self.total.failed
    }

    /// The report as one JSON object.
    pub(super) fn json(&self, store: &str) -> Value {
        let sessions: Vec<Value> = self
            .per_session
            .iter()
            .map(|(user, id, summary)| json!({"user": user, "session_id": id, "summary": summary}))
            .collect();
        json!({
            "ok": self.differ() == 0,
            "store": store,
            "summary": self.total,
            "sessions": sessions,
            "calls": self.reported,
            "calls_not_shown": self.not_shown,
        })
    }

    /// The report as text: [`text`].
    pub(super) fn text(&self, store: &str, tools: &BTreeSet<String>) -> String {
        let with_calls = self
            .per_session
            .iter()
            .filter(|(_, _, s)| s.replayed() + s.skipped > 0)
            .count();
        text(
            store,
            tools,
            (with_calls, self.per_session.len() - with_calls),
            &self.total,
            &self.reported,
            self.not_shown,
        )
    }

    /// Says on stderr how many calls differ, if any do.
    pub(super) fn say_what_differs(&self) {
        let differ = self.differ();
        if differ > 0 {
            print_note(&format!(
                "{} of {} {} from the journal",
                counted(differ, "call"),
                self.total.replayed(),
                if differ == 1 { "differs" } else { "differ" }
            ));
        }
    }
}

/// The store `flags` name, to replay `sessions` (all, when none is
/// named) of `owner` from: a replay writes nothing, so a store that does
/// not exist yet is not made, and there is nothing to replay.
pub(super) async fn store_to_replay(
    flags: &super::StoreFlags,
    sessions: &[String],
    owner: Option<&str>,
) -> Result<Arc<dyn SessionStore>, Failure> {
    let named = sessions.first().map(String::as_str);
    flags
        .open_to_read(named, owner, |location| {
            Failure::input(
                "no_calls",
                format!("there is no session to replay: the store {location} does not exist yet"),
            )
        })
        .await
}

/// The sessions `selection` names, with their owners.
pub(super) async fn chosen(
    selection: &Selection<'_>,
    store: &dyn SessionStore,
    owner: Option<&str>,
) -> Result<Vec<(Option<String>, String)>, Failure> {
    let since = selection
        .since
        .map(|text| {
            airlock::retention::parse_age(text)
                .map_err(|e| Failure::input("invalid_age", format!("--since {text:?}: {e}")))
        })
        .transpose()?;
    if !selection.sessions.is_empty() {
        if selection.all_users || since.is_some() {
            return Err(Failure::input(
                "invalid_selection",
                "name sessions, or choose them with --since and --all-users, not both",
            ));
        }
        for id in selection.sessions {
            super::checked_session_id(id)?;
        }
        // A session named twice is replayed once.
        let user = owner.map(str::to_owned);
        let mut named = BTreeSet::new();
        return Ok(selection
            .sessions
            .iter()
            .filter(|id| named.insert(id.as_str()))
            .map(|id| (user.clone(), id.clone()))
            .collect());
    }
    let owners = if selection.all_users {
        store.owners().await?
    } else {
        vec![owner.map(str::to_owned)]
    };
    let after = since.map(|age| {
        let age = u64::try_from(age.as_millis()).unwrap_or(u64::MAX);
        airlock::journal::now_ms().saturating_sub(age)
    });
    let mut chosen = Vec::new();
    for user in owners {
        let mut sessions = store.list(user.as_deref()).await?;
        sessions.retain(|s| after.is_none_or(|after| s.updated_at_ms >= after));
        // Oldest first: the order they were made in.
        sessions.reverse();
        chosen.extend(sessions.into_iter().map(|s| (user.clone(), s.session_id)));
    }
    Ok(chosen)
}

/// The text report: the summary line, then each call that is not the
/// same, with its place and what differs. `sessions`: how many sessions
/// had calls of `tools`, and how many more were read and had none.
fn text(
    store: &str,
    tools: &BTreeSet<String>,
    sessions: (usize, usize),
    total: &ReplaySummary,
    reported: &[Replayed],
    not_shown: u64,
) -> String {
    let tools: Vec<&str> = tools.iter().map(String::as_str).collect();
    let mut out = format!(
        "replayed {} of {} in {} of {store}: {} same, {} different, {} failed, {} cannot be \
         reproduced",
        counted(total.replayed(), "call"),
        tools.join(", "),
        counted(sessions.0 as u64, "session"),
        total.same,
        total.different,
        total.failed,
        total.cannot_reproduce,
    );
    if sessions.1 > 0 {
        out.push_str(&format!(
            " ({} more {} no call of {})",
            sessions.1,
            if sessions.1 == 1 {
                "session had"
            } else {
                "sessions had"
            },
            tools.join(", ")
        ));
    }
    if total.skipped > 0 {
        out.push_str(&format!(
            " ({} not replayed: rejected, cancelled or interrupted when made)",
            total.skipped
        ));
    }
    for call in reported {
        let place = format!(
            "{} record {}: {} {} {}",
            call.session_id,
            call.seq,
            call.tool,
            call.call_id,
            field(&call.arguments.to_string())
        );
        match &call.verdict {
            Verdict::Same => {}
            Verdict::Different { recorded, replayed } => {
                out.push_str(&format!("\ndifferent  {place}"));
                for line in diff(recorded, replayed) {
                    out.push_str(&format!("\n  {line}"));
                }
            }
            Verdict::Failed { error, .. } => {
                out.push_str(&format!("\nfailed     {place}\n  {}", field(error)));
            }
            Verdict::CannotReproduce { why } => {
                out.push_str(&format!("\ncannot reproduce  {place}\n  {}", field(why)));
            }
        }
    }
    if not_shown > 0 {
        out.push_str(&format!(
            "\n… and {} not the same, not shown (a report shows the first {MAX_SHOWN}; name \
             fewer sessions, or --since, to see the rest)",
            counted(not_shown, "more call")
        ));
    }
    out
}

/// What differs between two ends, one line per differing place (at most
/// [`MAX_DIFF_LINES`]): `result.stamp.label: "Beta" → "beta"`.
fn diff(recorded: &Ended, replayed: &Ended) -> Vec<String> {
    let mut lines = Vec::new();
    if recorded.status != replayed.status {
        lines.push(format!(
            "status: {} → {}",
            recorded.status.as_str(),
            replayed.status.as_str()
        ));
    }
    let ops = |ops: &[airlock::ContextOp]| serde_json::to_value(ops).unwrap_or(Value::Null);
    differing("result", &recorded.result, &replayed.result, &mut lines);
    differing("ops", &ops(&recorded.ops), &ops(&replayed.ops), &mut lines);
    if lines.len() > MAX_DIFF_LINES {
        let more = lines.len() - MAX_DIFF_LINES;
        lines.truncate(MAX_DIFF_LINES);
        lines.push(format!("… and {more} more (--json has both whole)"));
    }
    lines
}

/// Appends `path: a → b` for each place where `a` and `b` differ,
/// descending into objects and arrays of the same shape.
fn differing(path: &str, a: &Value, b: &Value, lines: &mut Vec<String>) {
    if a == b || lines.len() > MAX_DIFF_LINES {
        return;
    }
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            for key in keys {
                let (p, q) = (x.get(key), y.get(key));
                let at = format!("{path}.{key}");
                match (p, q) {
                    (Some(p), Some(q)) => differing(&at, p, q, lines),
                    (Some(p), None) => lines.push(format!("{at}: {} → (absent)", shown(p))),
                    (None, Some(q)) => lines.push(format!("{at}: (absent) → {}", shown(q))),
                    (None, None) => {}
                }
            }
        }
        (Value::Array(x), Value::Array(y)) if x.len() == y.len() => {
            for (i, (p, q)) in x.iter().zip(y).enumerate() {
                differing(&format!("{path}[{i}]"), p, q, lines);
            }
        }
        _ => lines.push(format!("{path}: {} → {}", shown(a), shown(b))),
    }
}

/// A value on one line, escaped for the terminal and cut at 200 bytes.
fn shown(value: &Value) -> String {
    let mut text = value.to_string();
    if text.len() > 200 {
        let mut end = 200;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    field(&text).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use airlock::journal::CallStatus;

    /// A replay where every call differs (a new version that changes every
    /// result), its calls in two sessions: the report keeps the first
    /// [`MAX_SHOWN`] of all whole and counts the rest, in text and JSON;
    /// every call is counted by tool.
    #[test]
    fn a_report_shows_a_bounded_number_of_calls_and_counts_the_rest() {
        let mut compared = Compared::default();
        // Each session's replay is counted apart, then added in order.
        let (mut first, mut second) = (Compared::default(), Compared::default());
        let end = |n: u64| Ended {
            status: CallStatus::Completed,
            result: json!({"n": n}),
            ops: Vec::new(),
        };
        let calls = MAX_SHOWN as u64 + 5;
        for seq in 0..calls {
            let verdict = Verdict::Different {
                recorded: end(seq),
                replayed: end(seq + 1),
            };
            compared.total.count(&verdict);
            let part = if seq < 600 { &mut first } else { &mut second };
            part.take(Replayed {
                session_id: "s".into(),
                seq,
                call_id: format!("c{seq}"),
                tool: "stamp".into(),
                arguments: json!({}),
                verdict,
            });
        }
        second.take(Replayed {
            session_id: "s".into(),
            seq: calls,
            call_id: "same".into(),
            tool: "stamp".into(),
            arguments: json!({}),
            verdict: Verdict::Same,
        });
        compared.add(first);
        compared.add(second);
        assert_eq!(compared.seen["stamp"], calls + 1);
        assert_eq!(compared.differ(), calls);
        let report = compared.json("store");
        assert_eq!(report["calls"].as_array().unwrap().len(), MAX_SHOWN);
        assert_eq!(report["calls"][0]["call_id"], "c0");
        assert_eq!(report["calls_not_shown"], 5);
        let tools = BTreeSet::from(["stamp".to_owned()]);
        let text = compared.text("store", &tools);
        assert_eq!(text.matches("\ndifferent  s record").count(), MAX_SHOWN);
        assert!(
            text.ends_with(
                "… and 5 more calls not the same, not shown (a report shows the first 1000; \
                 name fewer sessions, or --since, to see the rest)"
            ),
            "{}",
            &text[text.len() - 300..]
        );
    }

    #[test]
    fn a_diff_names_the_places_that_differ() {
        let end = |label: &str| Ended {
            status: CallStatus::Completed,
            result: json!({"stamp": {"label": label, "id": "ab"}, "n": [1, 2]}),
            ops: Vec::new(),
        };
        assert_eq!(
            diff(&end("Beta"), &end("beta")),
            vec!["result.stamp.label: \"Beta\" → \"beta\"".to_owned()]
        );
        assert!(diff(&end("a"), &end("a")).is_empty());
    }
}
