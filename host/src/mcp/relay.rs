//! What a call reports while it runs, as MCP notifications: its `log`
//! records as `notifications/message` (at or above the level the client
//! set with `logging/setLevel`; none before it does), its progress
//! reports as `notifications/progress` (when the request carries a
//! `progressToken`), and, for a tool that reports no progress of its own,
//! a "running" report each second.
//!
//! Progress reports closer together than [`PROGRESS_GAP`] are merged: the
//! latest waits and goes out once the gap has passed, or before the
//! result ([`Relay::flush`]). A report whose `done` reaches its `total`
//! always goes out. Log records closer together than [`PROGRESS_GAP`] are
//! merged too, none lost: their messages, one per line, in one
//! notification at the highest of their levels. A call that logs or
//! reports in a tight loop costs its client a few notifications, not one
//! per record. Cost for a call whose client asked for nothing: the
//! observer's check of an empty channel per event, and none when the tool
//! reports nothing.

// Logging is deprecated by SEP-2577 for later revisions; the 2025-06-18
// and 2025-11-25 revisions this server speaks have it.
#![allow(deprecated)]

use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use rmcp::model::{
    LoggingLevel, LoggingMessageNotificationParam, Notification, ProgressNotificationParam,
    ProgressToken, ServerNotification,
};

use crate::sandbox::{Asker, CallEvent, CancelToken, LogLevel, Sampler};

/// The least time between two progress notifications of one call.
pub const PROGRESS_GAP: Duration = Duration::from_millis(10);

/// The level a client set for its session's log notifications; none is
/// sent before it sets one.
#[derive(Debug, Default)]
pub struct LogThreshold(AtomicU8);

/// [`LogThreshold`]'s "not set".
const UNSET: u8 = u8::MAX;

impl LogThreshold {
    /// Nothing is sent until [`LogThreshold::set`].
    pub fn new() -> Self {
        Self(AtomicU8::new(UNSET))
    }

    /// Sends records at `level` and above from now on.
    pub fn set(&self, level: LoggingLevel) {
        self.0.store(rank(level), Ordering::Relaxed);
    }

    /// The least level sent, if the client set one.
    fn get(&self) -> Option<u8> {
        Some(self.0.load(Ordering::Relaxed)).filter(|r| *r != UNSET)
    }
}

/// A log level's place among MCP's (RFC 5424's order).
fn rank(level: LoggingLevel) -> u8 {
    match level {
        LoggingLevel::Debug => 0,
        LoggingLevel::Info => 1,
        LoggingLevel::Notice => 2,
        LoggingLevel::Warning => 3,
        LoggingLevel::Error => 4,
        LoggingLevel::Critical => 5,
        LoggingLevel::Alert => 6,
        LoggingLevel::Emergency => 7,
    }
}

/// A tool's log level as MCP names it.
fn level_of(level: LogLevel) -> LoggingLevel {
    match level {
        LogLevel::Trace | LogLevel::Debug => LoggingLevel::Debug,
        LogLevel::Info => LoggingLevel::Info,
        LogLevel::Warn => LoggingLevel::Warning,
        LogLevel::Error => LoggingLevel::Error,
    }
}

/// A call's events on their way to its client.
#[derive(Debug)]
pub struct Relay {
    tool: String,
    token: Option<ProgressToken>,
    threshold: Option<u8>,
    /// When the last progress notification went out.
    last: Option<Instant>,
    /// A report merged away, to send once the gap has passed or before
    /// the result.
    pending: Option<ProgressNotificationParam>,
    /// When the last log notification went out.
    last_log: Option<Instant>,
    /// Records merged away: the highest level and the messages.
    pending_logs: Option<(LoggingLevel, Vec<String>)>,
    /// Whether the tool reported progress itself (then no "running"
    /// report is made up for it).
    reported: bool,
    /// Seconds the call has run, counted by [`Relay::tick`].
    seconds: u32,
    events: tokio::sync::mpsc::UnboundedReceiver<CallEvent>,
}

impl Relay {
    /// The relay of a call of `tool` whose request carries `token`, on a
    /// session whose client set `threshold`, and the cancel token the call
    /// runs with (whose events it relays, and whose questions `asker`
    /// answers). No relay when the client asked for none of them.
    pub fn new(
        tool: &str,
        token: Option<ProgressToken>,
        threshold: &LogThreshold,
        asker: Option<Asker>,
        sampler: Option<Sampler>,
    ) -> (Option<Self>, CancelToken) {
        let threshold = threshold.get();
        if token.is_none() && threshold.is_none() {
            return (None, CancelToken::watched(None, asker, sampler));
        }
        let (sender, events) = tokio::sync::mpsc::unbounded_channel();
        let wanted_progress = token.is_some();
        let observer = move |event: CallEvent| {
            let wanted = match &event {
                CallEvent::Log(record) => {
                    threshold.is_some_and(|t| rank(level_of(record.level)) >= t)
                }
                CallEvent::Progress { .. } => wanted_progress,
            };
            if wanted {
                // The call's own bounds (log bytes, report count) bound
                // what waits here.
                let _ = sender.send(event);
            }
        };
        let cancel = CancelToken::watched(Some(Box::new(observer)), asker, sampler);
        let relay = Self {
            tool: tool.to_owned(),
            token,
            threshold,
            last: None,
            pending: None,
            last_log: None,
            pending_logs: None,
            reported: false,
            seconds: 0,
            events,
        };
        (Some(relay), cancel)
    }

    /// The next event of the call, once there is one (`None` once the
    /// call and its token are gone).
    pub async fn next(&mut self) -> Option<CallEvent> {
        self.events.recv().await
    }

    /// Runs `work` (the call) to its end, sending what it reports
    /// meanwhile through `send` (and a "running" report each second while
    /// it reports no progress of its own), then what is left of it
    /// before returning its output.
    pub async fn run<F, S, Sent>(&mut self, work: F, mut send: S) -> F::Output
    where
        F: Future,
        S: FnMut(ServerNotification) -> Sent,
        Sent: Future<Output = ()>,
    {
        let mut work = std::pin::pin!(work);
        let every = super::PROGRESS_EVERY;
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        loop {
            let due = self.due();
            let notes: Vec<ServerNotification> = tokio::select! {
                biased;
                output = &mut work => {
                    for note in self.rest() {
                        send(note).await;
                    }
                    return output;
                }
                Some(event) = self.events.recv() => self.relay(event),
                () = sleep_until(due), if due.is_some() => self.flush_due(),
                _ = tick.tick(), if self.has_token() => self.tick().into_iter().collect(),
            };
            for note in notes {
                send(note).await;
            }
        }
    }

    /// The notifications of the events waiting now (none waits after),
    /// all taken as made now: the clock is read once for them.
    pub fn relay_waiting(&mut self) -> Vec<ServerNotification> {
        let mut notes = Vec::new();
        let now = Instant::now();
        while let Ok(event) = self.events.try_recv() {
            notes.extend(self.relay_at(event, now));
        }
        notes
    }

    /// What is left once the call has ended: the events it made that are
    /// not sent yet, and what was merged away.
    pub fn rest(&mut self) -> Vec<ServerNotification> {
        let mut notes = self.relay_waiting();
        notes.extend(self.flush_logs());
        notes.extend(self.flush());
        notes
    }

    /// When what waits (a merged report, merged records) may go out.
    fn due(&self) -> Option<Instant> {
        let progress = self
            .pending
            .as_ref()
            .and(self.last)
            .map(|at| at + PROGRESS_GAP);
        let logs = self
            .pending_logs
            .as_ref()
            .and(self.last_log)
            .map(|at| at + PROGRESS_GAP);
        match (progress, logs) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// What waited and may go out now.
    fn flush_due(&mut self) -> Vec<ServerNotification> {
        let now = Instant::now();
        let mut notes = Vec::new();
        if self.last_log.is_some_and(|at| now - at >= PROGRESS_GAP) {
            notes.extend(self.flush_logs());
        }
        if self.last.is_some_and(|at| now - at >= PROGRESS_GAP)
            && let Some(param) = self.pending.take()
        {
            self.last = Some(now);
            notes.push(progress(param));
        }
        notes
    }

    /// The records merged away, as one notification.
    fn flush_logs(&mut self) -> Option<ServerNotification> {
        let (level, messages) = self.pending_logs.take()?;
        self.last_log = Some(Instant::now());
        Some(self.log_note(level, messages.join("\n")))
    }

    fn log_note(&self, level: LoggingLevel, message: String) -> ServerNotification {
        let param = LoggingMessageNotificationParam::new(level, message.into())
            .with_logger(self.tool.clone());
        ServerNotification::LoggingMessageNotification(Notification::new(param))
    }

    /// The notifications `event` makes now (none, one, or a merged report
    /// and this one).
    pub fn relay(&mut self, event: CallEvent) -> Vec<ServerNotification> {
        self.relay_at(event, Instant::now())
    }

    /// The notifications `event`, made at `now`, makes.
    fn relay_at(&mut self, event: CallEvent, now: Instant) -> Vec<ServerNotification> {
        match event {
            CallEvent::Log(record) if self.threshold.is_some() => {
                let level = level_of(record.level);
                if self.last_log.is_some_and(|at| now - at < PROGRESS_GAP) {
                    let (merged, messages) =
                        self.pending_logs.get_or_insert_with(|| (level, Vec::new()));
                    if rank(level) > rank(*merged) {
                        *merged = level;
                    }
                    messages.push(record.message);
                    return Vec::new();
                }
                let mut notes: Vec<ServerNotification> = self.flush_logs().into_iter().collect();
                self.last_log = Some(now);
                notes.push(self.log_note(level, record.message));
                notes
            }
            CallEvent::Progress {
                done,
                total,
                message,
            } => {
                let Some(token) = &self.token else {
                    return Vec::new();
                };
                self.reported = true;
                let mut param = ProgressNotificationParam::new(token.clone(), done);
                param.total = total;
                param.message = message;
                let last = total.is_some_and(|t| done >= t);
                if !last && self.last.is_some_and(|at| now - at < PROGRESS_GAP) {
                    self.pending = Some(param);
                    return Vec::new();
                }
                self.last = Some(now);
                self.pending = None;
                vec![progress(param)]
            }
            CallEvent::Log(_) => Vec::new(),
        }
    }

    /// Another second of running: a "running" report when the tool
    /// reports no progress of its own, or the report merged away (which
    /// [`Relay::run`] sends once its gap has passed).
    pub fn tick(&mut self) -> Option<ServerNotification> {
        self.seconds += 1;
        if self.reported {
            return self.flush();
        }
        let token = self.token.clone()?;
        Some(progress(super::progress(&token, &self.tool, self.seconds)))
    }

    /// The report merged away, if any: to send before the result.
    pub fn flush(&mut self) -> Option<ServerNotification> {
        self.pending.take().map(progress)
    }

    /// Whether the request carries a progress token (the call is then
    /// worth a running report each second).
    pub fn has_token(&self) -> bool {
        self.token.is_some()
    }
}

/// Sleeps until `due` (forever without one: its branch is off then).
async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

fn progress(param: ProgressNotificationParam) -> ServerNotification {
    ServerNotification::ProgressNotification(Notification::new(param))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::LogRecord;

    fn report(done: f64, total: Option<f64>) -> CallEvent {
        CallEvent::Progress {
            done,
            total,
            message: None,
        }
    }

    #[test]
    fn nothing_is_relayed_that_the_client_did_not_ask_for() {
        let threshold = LogThreshold::new();
        assert!(Relay::new("t", None, &threshold, None, None).0.is_none());
        threshold.set(LoggingLevel::Warning);
        let mut relay = Relay::new("t", None, &threshold, None, None).0.unwrap();
        let info = CallEvent::Log(LogRecord {
            level: LogLevel::Info,
            message: "quiet".into(),
        });
        // The observer drops what is below the threshold; a relay given it
        // anyway sends the record (its level was checked upstream).
        assert_eq!(relay.relay(info).len(), 1);
        assert!(
            relay.relay(report(1.0, None)).is_empty(),
            "no progress token"
        );
        assert!(relay.tick().is_none());
    }

    #[test]
    fn close_reports_merge_and_the_last_one_always_goes_out() {
        let threshold = LogThreshold::new();
        let token = ProgressToken(rmcp::model::NumberOrString::Number(7));
        let mut relay = Relay::new("t", Some(token), &threshold, None, None)
            .0
            .unwrap();
        assert_eq!(relay.relay(report(0.0, Some(100.0))).len(), 1);
        assert!(relay.relay(report(50.0, Some(100.0))).is_empty(), "merged");
        assert!(relay.relay(report(60.0, Some(100.0))).is_empty(), "merged");
        assert_eq!(relay.relay(report(100.0, Some(100.0))).len(), 1, "the last");
        assert!(
            relay.flush().is_none(),
            "the final one replaced what waited"
        );
        assert!(relay.relay(report(101.0, None)).is_empty(), "merged");
        assert!(relay.tick().is_some(), "the merged one, at the next tick");
        assert!(relay.flush().is_none());
        assert!(
            relay.tick().is_none(),
            "no made-up report once the tool reports"
        );
    }

    #[test]
    fn close_records_merge_into_one_note_at_their_highest_level() {
        let threshold = LogThreshold::new();
        threshold.set(LoggingLevel::Debug);
        let mut relay = Relay::new("t", None, &threshold, None, None).0.unwrap();
        let log = |level, message: &str| {
            CallEvent::Log(LogRecord {
                level,
                message: message.into(),
            })
        };
        assert_eq!(relay.relay(log(LogLevel::Info, "one")).len(), 1);
        assert!(relay.relay(log(LogLevel::Warn, "two")).is_empty(), "merged");
        assert!(
            relay.relay(log(LogLevel::Debug, "three")).is_empty(),
            "merged"
        );
        assert!(relay.due().is_some());
        let rest = relay.rest();
        let [ServerNotification::LoggingMessageNotification(note)] = rest.as_slice() else {
            panic!("{rest:?}");
        };
        assert_eq!(note.params.level, LoggingLevel::Warning);
        assert_eq!(note.params.data, serde_json::json!("two\nthree"));
        assert!(relay.due().is_none());
    }
}
