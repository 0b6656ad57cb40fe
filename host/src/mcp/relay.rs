//! What a call reports while it runs, as MCP notifications: its `log`
//! records as `notifications/message` (at or above the level the client
//! set with `logging/setLevel`; none before it does), its progress
//! reports as `notifications/progress` (when the request carries a
//! `progressToken`), and, for a tool that reports no progress of its own,
//! a "running" report each second.
//!
//! Progress reports closer together than [`PROGRESS_GAP`] are merged: the
//! latest waits and goes out once the gap has passed, the first time the
//! call's task runs after it (the call reports again, its wasm yields, a
//! read it waits for is done), at the latest at the next second's tick
//! ([`Relay::tick`], from the server's one clock of seconds,
//! [`Seconds`]), and always before the result ([`Relay::rest`]). A
//! report whose `done` reaches its `total` always goes out. Log records
//! closer together than [`PROGRESS_GAP`] are merged the same way, none
//! lost: their messages, one per line, in one notification at the
//! highest of their levels. A call that logs or reports in a tight loop
//! costs its client a few notifications, not one per record.
//!
//! The merging is done where the call reports, on the thread running it,
//! under a lock no one else holds for long: a report merged away costs
//! the lock and a copy of its message (a log record's text appended to
//! what waits), reads no clock and wakes no task. The clock is read when
//! a notification goes out, and by the relay when it looks for what
//! waits ([`Relay::ready`]): a gap counts as open until the relay has
//! seen it pass, so a report made after the gap, before the relay next
//! looks, joins what waits and goes out with it then. The relay runs in
//! the task that runs the call, so it looks whenever the call waits or
//! yields (its wasm yields at least every few milliseconds), which is
//! when it could send anything anyway. Only a notification due now wakes
//! the relay. No timer is set per notification: a timer earlier than any
//! the runtime has wakes the worker parked on its timer driver, which
//! cost a short call more than all of its merging (§18 of the
//! benchmarks); for the same reason the seconds of all of a server's calls
//! come from one timer ([`Seconds`]), not one per call. Cost for a call
//! whose client asked for nothing: no relay, and one check per event.

// Logging is deprecated by SEP-2577 for later revisions; the 2025-06-18
// and 2025-11-25 revisions this server speaks have it.
#![allow(deprecated)]

use std::sync::atomic::{AtomicBool, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use futures::task::AtomicWaker;
use rmcp::model::{
    LoggingLevel, LoggingMessageNotification, LoggingMessageNotificationParam, Notification,
    ProgressNotificationParam, ProgressToken, ServerNotification,
};

use super::{PROGRESS_EVERY, lock};
use crate::sandbox::{Asker, CallEvent, CancelToken, LogLevel, Progress, Sampler};

/// The least time between two progress notifications of one call.
pub const PROGRESS_GAP: Duration = Duration::from_millis(10);

/// What merged log records are first given room for (a tool that logs
/// a line a step, for 100 steps, fits).
const MERGED_LOGS: usize = 2048;

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

/// Adds a record at `level` saying `message` to records merged at
/// `merged`: one more line of `text`, at the higher of the two levels.
fn append_record(merged: &mut LoggingLevel, text: &mut String, level: LoggingLevel, message: &str) {
    if rank(level) > rank(*merged) {
        *merged = level;
    }
    text.push('\n');
    text.push_str(message);
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

/// One clock of seconds for all the calls of a server that relay what
/// they report: a tick each second from one timer, while any call
/// listens ([`Seconds::listen`]).
///
/// A timer of each call's own would cost the call a wake of the thread
/// parked on the runtime's timer driver whenever it is the earliest timer
/// the runtime has (tokio unparks the driver then), which on this machine
/// cost a short call more than all of its merging (§18 of the
/// benchmarks). Listening costs a few atomic operations and no wake; the
/// timer's task wakes once a second while calls listen, stops after a
/// second in which none did, and the next call to listen starts it again
/// (on the runtime it listens from).
#[derive(Debug, Clone)]
pub struct Seconds {
    clock: Arc<Clock>,
}

/// What [`Seconds`] and its listeners share.
#[derive(Debug)]
struct Clock {
    tick: tokio::sync::watch::Sender<()>,
    /// How many [`Listening`]s there are.
    listening: AtomicUsize,
    /// Whether any call began listening since the last tick.
    begun: AtomicBool,
    /// Whether the timer's task runs (or is about to).
    ticking: AtomicBool,
}

/// A call listening to the server's [`Seconds`].
#[derive(Debug)]
pub struct Listening {
    clock: Arc<Clock>,
    ticks: tokio::sync::watch::Receiver<()>,
    since: Instant,
    /// The seconds [`Listening::next`] last gave.
    counted: u32,
}

impl Default for Seconds {
    fn default() -> Self {
        Self {
            clock: Arc::new(Clock {
                tick: tokio::sync::watch::Sender::new(()),
                listening: AtomicUsize::new(0),
                begun: AtomicBool::new(false),
                ticking: AtomicBool::new(false),
            }),
        }
    }
}

impl Seconds {
    /// Listens from now on, starting the timer if it has stopped (on the
    /// current tokio runtime; outside one, no tick comes).
    pub fn listen(&self) -> Listening {
        let clock = &self.clock;
        let ticks = clock.tick.subscribe();
        clock.listening.fetch_add(1, Ordering::SeqCst);
        clock.begun.store(true, Ordering::SeqCst);
        if !clock.ticking.swap(true, Ordering::SeqCst) {
            match tokio::runtime::Handle::try_current() {
                Ok(runtime) => drop(runtime.spawn(tick(Running {
                    clock: Arc::clone(clock),
                    holds: true,
                }))),
                Err(_) => clock.ticking.store(false, Ordering::SeqCst),
            }
        }
        Listening {
            clock: Arc::clone(clock),
            ticks,
            since: Instant::now(),
            counted: 0,
        }
    }
}

/// The timer's task's hold on the clock: marks the timer stopped however
/// the task ends (its runtime shut down drops it, run or not), unless it
/// handed its place on.
struct Running {
    clock: Arc<Clock>,
    /// Whether the task is the clock's timer (`ticking` is its).
    holds: bool,
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.holds {
            self.clock.ticking.store(false, Ordering::SeqCst);
        }
    }
}

/// The timer's task: a tick each [`PROGRESS_EVERY`] until a tick
/// finds that no call listens or began to since the one before.
async fn tick(mut running: Running) {
    let every = PROGRESS_EVERY;
    let mut timer = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
    timer.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        timer.tick().await;
        let clock = &running.clock;
        clock.tick.send_replace(());
        if clock.begun.swap(false, Ordering::SeqCst) || clock.listening.load(Ordering::SeqCst) > 0 {
            continue;
        }
        // Stopped, unless a call began to listen meanwhile and found the
        // timer still running (then it runs on); a call that finds it
        // stopped starts another.
        clock.ticking.store(false, Ordering::SeqCst);
        if clock.listening.load(Ordering::SeqCst) == 0 || clock.ticking.swap(true, Ordering::SeqCst)
        {
            running.holds = false;
            return;
        }
    }
}

impl Listening {
    /// The seconds it has listened, counted in ticks: the first tick at
    /// least a second after it began counts 1 (it comes between one and
    /// two seconds after), each tick after it one more (ticks are at
    /// least a second apart, so the count never runs ahead of the time).
    pub async fn next(&mut self) -> u32 {
        loop {
            if self.ticks.changed().await.is_err() {
                // The clock is held here, so its sender lives: unreachable.
                return std::future::pending().await;
            }
            if self.counted > 0 || self.since.elapsed() >= PROGRESS_EVERY {
                self.counted = self.counted.saturating_add(1);
                return self.counted;
            }
        }
    }
}

impl Drop for Listening {
    fn drop(&mut self) {
        self.clock.listening.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A call's events on their way to its client.
#[derive(Debug)]
pub struct Relay {
    shared: Arc<Shared>,
}

/// What the call's observer and its relay share.
#[derive(Debug)]
struct Shared {
    merge: Mutex<Merge>,
    /// The relay's task, woken when [`Merge::ready`] stops being empty.
    waker: AtomicWaker,
}

/// The notifications of a call as its events make them, merged.
#[derive(Debug)]
struct Merge {
    tool: String,
    token: Option<ProgressToken>,
    /// Notifications due now, not yet taken by the relay.
    ready: Vec<ServerNotification>,
    /// Whether the tool reported progress of its own (until then, a
    /// "running" report is made up for it each second).
    reported: bool,
    /// Until when progress reports are merged: [`PROGRESS_GAP`] after
    /// the last progress notification, until the relay sees it has
    /// passed (none: the next report goes out at once).
    closed: Option<Instant>,
    /// A report merged away, to send once the gap has passed or before
    /// the result.
    pending: Option<Progress>,
    /// Until when log records are merged, as `closed` for progress.
    logs_closed: Option<Instant>,
    /// Records merged away: the highest level and the messages, one per
    /// line.
    pending_logs: Option<(LoggingLevel, String)>,
    /// Whether the relay's task is polling the call, about to look at
    /// what is due ([`Relay::polling`]): what the call makes due then
    /// wakes no one.
    polling: bool,
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
        let wanted_progress = token.is_some();
        let shared = Arc::new(Shared {
            merge: Mutex::new(Merge {
                tool: tool.to_owned(),
                token,
                ready: Vec::new(),
                reported: false,
                closed: None,
                pending: None,
                logs_closed: None,
                pending_logs: None,
                polling: false,
            }),
            waker: AtomicWaker::new(),
        });
        let observer = {
            let shared = Arc::clone(&shared);
            move |event: CallEvent<'_>| {
                let wanted = match &event {
                    CallEvent::Log(record) => {
                        threshold.is_some_and(|t| rank(level_of(record.level)) >= t)
                    }
                    CallEvent::Progress(_) => wanted_progress,
                };
                if wanted {
                    shared.take(event);
                }
            }
        };
        let cancel = CancelToken::watched(Some(Box::new(observer)), asker, sampler);
        let relay = Self { shared };
        (Some(relay), cancel)
    }

    /// Polls `work` (the call) for the relay's task, which looks at
    /// [`Relay::ready`] right after it in the same pass: what the call
    /// makes due while polled wakes no one. Waking the task from inside
    /// its own poll would have the runtime poll it again and wake a parked
    /// worker to share it (a wake per call, for nothing).
    pub fn polling<'a, F>(&'a self, work: &'a mut F) -> impl Future<Output = F::Output> + 'a
    where
        F: Future + Unpin,
    {
        std::future::poll_fn(move |cx| {
            lock(&self.shared.merge).polling = true;
            let polled = std::pin::Pin::new(&mut *work).poll(cx);
            lock(&self.shared.merge).polling = false;
            polled
        })
    }

    /// The notifications due, once there are some: those the call made
    /// due, and what was merged and whose gap has passed by a time this
    /// is polled (pending forever once the call has ended and they were
    /// taken).
    pub async fn ready(&self) -> Vec<ServerNotification> {
        std::future::poll_fn(|cx| {
            // Registered before looking: a note made due meanwhile wakes.
            self.shared.waker.register(cx.waker());
            let mut merge = lock(&self.shared.merge);
            let mut notes = std::mem::take(&mut merge.ready);
            if merge.pending.is_some() || merge.pending_logs.is_some() {
                merge.flush_past(Instant::now(), &mut notes);
            }
            if notes.is_empty() {
                Poll::Pending
            } else {
                Poll::Ready(notes)
            }
        })
        .await
    }

    /// Runs `work` (the call) to its end, sending what it reports
    /// meanwhile through `send` (and, at the ticks of `seconds`, what was
    /// merged and waits, and a "running" report while it reports no
    /// progress of its own), then what is left of it before returning its
    /// output.
    pub async fn run<F, S, Sent>(&self, work: F, mut seconds: Listening, mut send: S) -> F::Output
    where
        F: Future,
        S: FnMut(ServerNotification) -> Sent,
        Sent: Future<Output = ()>,
    {
        let mut work = std::pin::pin!(work);
        loop {
            let notes: Vec<ServerNotification> = tokio::select! {
                biased;
                output = self.polling(&mut work) => {
                    for note in self.rest() {
                        send(note).await;
                    }
                    return output;
                }
                notes = self.ready() => notes,
                ran = seconds.next() => self.tick(ran),
            };
            for note in notes {
                send(note).await;
            }
        }
    }

    /// What is left once the call has ended: the notifications due and
    /// not taken, and what was merged away.
    pub fn rest(&self) -> Vec<ServerNotification> {
        let mut merge = lock(&self.shared.merge);
        let mut notes = std::mem::take(&mut merge.ready);
        notes.extend(merge.flush_logs());
        notes.extend(merge.flush());
        notes
    }

    /// The notifications `event`, made at `now`, makes (none, one, or
    /// what was merged and this one), with any due before it: the
    /// observer's work, at a time a test chooses.
    #[cfg(test)]
    fn relay_at(&self, event: CallEvent<'_>, now: Instant) -> Vec<ServerNotification> {
        let mut merge = lock(&self.shared.merge);
        merge.take(event, || now);
        std::mem::take(&mut merge.ready)
    }

    /// What the relay sends when it looks at `now` ([`Relay::ready`]'s
    /// work, at a time a test chooses).
    #[cfg(test)]
    fn look_at(&self, now: Instant) -> Vec<ServerNotification> {
        let mut merge = lock(&self.shared.merge);
        let mut notes = std::mem::take(&mut merge.ready);
        merge.flush_past(now, &mut notes);
        notes
    }

    /// The call has run `seconds`: what was merged away and waits, and a
    /// "running" report when the request carries a progress token and
    /// the tool reports no progress of its own.
    pub fn tick(&self, seconds: u32) -> Vec<ServerNotification> {
        let mut merge = lock(&self.shared.merge);
        let mut notes = std::mem::take(&mut merge.ready);
        notes.extend(merge.flush_logs());
        if merge.reported {
            notes.extend(merge.flush());
        } else if let Some(token) = &merge.token {
            let running = super::progress(token, &merge.tool, seconds);
            notes.push(progress(running));
        }
        notes
    }
}

impl Shared {
    /// Merges `event`, waking the relay when it makes a notification due.
    fn take(&self, event: CallEvent<'_>) {
        let mut merge = lock(&self.merge);
        let idle = merge.ready.is_empty();
        merge.take(event, Instant::now);
        if idle && !merge.ready.is_empty() && !merge.polling {
            drop(merge);
            self.waker.wake();
        }
    }
}

impl Merge {
    /// Adds what `event` makes due to [`Merge::ready`]: nothing (merged
    /// in a gap still open as far as the relay has seen), or it (opening
    /// a gap at `now`, the clock read only then).
    fn take(&mut self, event: CallEvent<'_>, now: impl FnOnce() -> Instant) {
        match event {
            CallEvent::Log(record) => {
                let level = level_of(record.level);
                if self.logs_closed.is_some() {
                    match &mut self.pending_logs {
                        Some((merged, messages)) => {
                            append_record(merged, messages, level, &record.message);
                        }
                        None => {
                            // Room for a run of records at once: a merged
                            // text grown record by record copies itself.
                            let mut text = String::with_capacity(MERGED_LOGS);
                            text.push_str(&record.message);
                            self.pending_logs = Some((level, text));
                        }
                    }
                    return;
                }
                self.logs_closed = Some(now() + PROGRESS_GAP);
                let note = self.log_note(level, record.into_owned().message);
                self.ready.push(note);
            }
            CallEvent::Progress(report) => {
                if self.token.is_none() {
                    return;
                }
                self.reported = true;
                let last = report.total.is_some_and(|t| report.done >= t);
                match &mut self.pending {
                    // The allocation of a merged message is reused.
                    Some(pending) => {
                        pending.done = report.done;
                        pending.total = report.total;
                        pending.message.clone_from(&report.message);
                    }
                    None => self.pending = Some(report.into_owned()),
                }
                if !last && self.closed.is_some() {
                    return;
                }
                self.closed = Some(now() + PROGRESS_GAP);
                let note = self.flush();
                self.ready.extend(note);
            }
        }
    }

    /// Adds to `notes` what was merged in a gap that has passed at `now`,
    /// opening the next gap; a gap that passed with nothing merged ends
    /// (the next report goes out at once).
    fn flush_past(&mut self, now: Instant, notes: &mut Vec<ServerNotification>) {
        if self.logs_closed.is_some_and(|until| until <= now) {
            let merged = self.flush_logs();
            self.logs_closed = merged.is_some().then_some(now + PROGRESS_GAP);
            notes.extend(merged);
        }
        if self.closed.is_some_and(|until| until <= now) {
            let merged = self.flush();
            self.closed = merged.is_some().then_some(now + PROGRESS_GAP);
            notes.extend(merged);
        }
    }

    /// The records merged away, as one notification.
    fn flush_logs(&mut self) -> Option<ServerNotification> {
        let (level, messages) = self.pending_logs.take()?;
        Some(self.log_note(level, messages))
    }

    fn log_note(&self, level: LoggingLevel, message: String) -> ServerNotification {
        let param = LoggingMessageNotificationParam::new(level, message.into())
            .with_logger(self.tool.clone());
        ServerNotification::LoggingMessageNotification(Notification::new(param))
    }

    /// The report merged away, if any, as a notification.
    fn flush(&mut self) -> Option<ServerNotification> {
        let report = self.pending.take()?;
        let token = self.token.clone()?;
        let mut param = ProgressNotificationParam::new(token, report.done);
        param.total = report.total;
        param.message = report.message;
        Some(progress(param))
    }
}

fn progress(param: ProgressNotificationParam) -> ServerNotification {
    ServerNotification::ProgressNotification(Notification::new(param))
}

/// `notes` (a call's, in the order made) as its client gets them when
/// they reach it at once, with the call's result (an answer held until
/// the call ended): its log records in one notification, one per line at
/// the highest of their levels, then its latest progress report. Sent
/// together, the rest would tell the client nothing more, and cost the
/// writing and reading.
pub fn at_once(notes: Vec<ServerNotification>) -> Vec<ServerNotification> {
    let mut logged: Option<LoggingMessageNotification> = None;
    let mut latest = None;
    let mut others = Vec::new();
    for note in notes {
        match note {
            ServerNotification::LoggingMessageNotification(note) => match &mut logged {
                Some(first) => {
                    let (first, next) = (&mut first.params, note.params);
                    if let (serde_json::Value::String(text), serde_json::Value::String(more)) =
                        (&mut first.data, &next.data)
                    {
                        append_record(&mut first.level, text, next.level, more);
                    } else {
                        // Not made by this relay: sent as it is.
                        let note = Notification::new(next);
                        others.push(ServerNotification::LoggingMessageNotification(note));
                    }
                }
                None => logged = Some(note),
            },
            ServerNotification::ProgressNotification(note) => latest = Some(note),
            other => others.push(other),
        }
    }
    let logged = logged.map(ServerNotification::LoggingMessageNotification);
    let latest = latest.map(ServerNotification::ProgressNotification);
    logged.into_iter().chain(others).chain(latest).collect()
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use serde_json::json;

    use super::*;
    use crate::sandbox::LogRecord;

    fn report(done: f64, total: Option<f64>) -> CallEvent<'static> {
        CallEvent::Progress(Cow::Owned(Progress {
            done,
            total,
            message: None,
        }))
    }

    #[test]
    fn nothing_is_relayed_that_the_client_did_not_ask_for() {
        let t0 = Instant::now();
        let threshold = LogThreshold::new();
        assert!(Relay::new("t", None, &threshold, None, None).0.is_none());
        threshold.set(LoggingLevel::Warning);
        let relay = Relay::new("t", None, &threshold, None, None).0.unwrap();
        let info = CallEvent::Log(Cow::Owned(LogRecord {
            level: LogLevel::Info,
            message: "quiet".into(),
        }));
        // The observer drops what is below the threshold; a relay given it
        // anyway sends the record (its level was checked upstream).
        assert_eq!(relay.relay_at(info, t0).len(), 1);
        assert!(
            relay.relay_at(report(1.0, None), t0).is_empty(),
            "no progress token"
        );
        assert!(relay.tick(1).is_empty(), "no progress token");
    }

    #[test]
    fn close_reports_merge_and_the_last_one_always_goes_out() {
        let t0 = Instant::now();
        let threshold = LogThreshold::new();
        let token = ProgressToken(rmcp::model::NumberOrString::Number(7));
        let relay = Relay::new("t", Some(token), &threshold, None, None)
            .0
            .unwrap();
        assert_eq!(relay.relay_at(report(0.0, Some(100.0)), t0).len(), 1);
        assert!(
            relay.relay_at(report(50.0, Some(100.0)), t0).is_empty(),
            "merged"
        );
        assert!(
            relay.relay_at(report(60.0, Some(100.0)), t0).is_empty(),
            "merged"
        );
        assert_eq!(
            relay.relay_at(report(100.0, Some(100.0)), t0).len(),
            1,
            "the last"
        );
        assert!(
            relay.relay_at(report(101.0, None), t0).is_empty(),
            "merged: the last closed the gap again"
        );
        assert_eq!(relay.tick(1).len(), 1, "the merged one, at the next tick");
        assert!(relay.rest().is_empty(), "nothing left waiting");
        assert!(
            relay.tick(1).is_empty(),
            "no made-up report once the tool reports"
        );
    }

    #[test]
    fn close_records_merge_into_one_note_at_their_highest_level() {
        let t0 = Instant::now();
        let threshold = LogThreshold::new();
        threshold.set(LoggingLevel::Debug);
        let relay = Relay::new("t", None, &threshold, None, None).0.unwrap();
        let log = |level, message: &str| {
            CallEvent::Log(Cow::Owned(LogRecord {
                level,
                message: message.into(),
            }))
        };
        assert_eq!(relay.relay_at(log(LogLevel::Info, "one"), t0).len(), 1);
        assert!(
            relay.relay_at(log(LogLevel::Warn, "two"), t0).is_empty(),
            "merged"
        );
        assert!(
            relay.relay_at(log(LogLevel::Debug, "three"), t0).is_empty(),
            "merged"
        );
        let merged = |notes: Vec<ServerNotification>| {
            let [ServerNotification::LoggingMessageNotification(note)] = notes.as_slice() else {
                panic!("{notes:?}");
            };
            (note.params.level, note.params.data.clone())
        };
        assert_eq!(
            merged(relay.tick(1)),
            (LoggingLevel::Warning, serde_json::json!("two\nthree")),
            "what waited, at the next tick"
        );
        assert!(
            relay.relay_at(log(LogLevel::Info, "four"), t0).is_empty(),
            "merged"
        );
        assert_eq!(
            merged(relay.rest()),
            (LoggingLevel::Info, serde_json::json!("four")),
            "what waited, before the result"
        );
        assert!(relay.rest().is_empty());
        assert!(
            relay.relay_at(log(LogLevel::Info, "five"), t0).is_empty(),
            "merged"
        );
        assert!(
            relay.look_at(t0).is_empty(),
            "the relay looks within the gap: what waits, waits"
        );
        // A record made past the gap, before the relay has looked, joins
        // what waits; the relay's look sends both and opens a gap again.
        let past = t0 + PROGRESS_GAP;
        assert!(relay.relay_at(log(LogLevel::Error, "six"), past).is_empty());
        assert_eq!(
            merged(relay.look_at(past)),
            (LoggingLevel::Error, serde_json::json!("five\nsix"))
        );
        assert!(
            relay
                .relay_at(log(LogLevel::Info, "seven"), past)
                .is_empty(),
            "merged"
        );
        // A gap that passes with nothing merged ends: the next record goes
        // out at once.
        let later = past + PROGRESS_GAP;
        assert_eq!(merged(relay.look_at(later)).1, serde_json::json!("seven"));
        let much_later = later + PROGRESS_GAP;
        assert!(relay.look_at(much_later).is_empty(), "nothing waited");
        assert_eq!(
            merged(relay.relay_at(log(LogLevel::Info, "eight"), much_later)).1,
            serde_json::json!("eight")
        );
    }

    #[test]
    fn notes_that_reach_the_client_at_once_are_one_log_and_the_latest_progress() {
        let t0 = Instant::now();
        let threshold = LogThreshold::new();
        threshold.set(LoggingLevel::Debug);
        let token = ProgressToken(rmcp::model::NumberOrString::Number(7));
        let relay = Relay::new("t", Some(token), &threshold, None, None)
            .0
            .unwrap();
        let log = |level, message: String| CallEvent::Log(Cow::Owned(LogRecord { level, message }));
        // A call that reports three times within the gap, then ends: the
        // first report of each kind goes out at once, the rest is merged.
        let mut notes = Vec::new();
        for i in 1..=3 {
            notes.extend(relay.relay_at(report(f64::from(i), Some(4.0)), t0));
            let level = if i == 2 {
                LogLevel::Warn
            } else {
                LogLevel::Info
            };
            notes.extend(relay.relay_at(log(level, format!("step {i}")), t0));
        }
        notes.extend(relay.rest());
        assert_eq!(notes.len(), 4, "{notes:?}");
        // A later note of the relay's kind (text): its text joins the
        // merged records after them.
        let later = LoggingMessageNotificationParam::new(LoggingLevel::Debug, json!("step 4"));
        notes.push(ServerNotification::LoggingMessageNotification(
            Notification::new(later),
        ));
        // Not one of the relay's: kept as it is.
        let other = LoggingMessageNotificationParam::new(LoggingLevel::Info, json!({"n": 1}));
        notes.push(ServerNotification::LoggingMessageNotification(
            Notification::new(other),
        ));
        let sent = at_once(notes);
        let [
            ServerNotification::LoggingMessageNotification(logged),
            ServerNotification::LoggingMessageNotification(kept),
            ServerNotification::ProgressNotification(latest),
        ] = sent.as_slice()
        else {
            panic!("one log, the other, the latest progress");
        };
        assert_eq!(logged.params.level, LoggingLevel::Warning, "the highest");
        assert_eq!(logged.params.data, json!("step 1\nstep 2\nstep 3\nstep 4"));
        assert_eq!(logged.params.logger.as_deref(), Some("t"));
        assert_eq!(kept.params.data, json!({"n": 1}));
        assert_eq!(latest.params.progress, 3.0);
        assert_eq!(latest.params.total, Some(4.0));
        assert!(at_once(Vec::new()).is_empty());
    }

    #[test]
    fn what_the_call_makes_due_while_the_relay_polls_it_wakes_no_one() {
        use std::sync::atomic::AtomicUsize;
        use std::task::{Context, Poll};
        struct Counted(AtomicUsize);
        impl futures::task::ArcWake for Counted {
            fn wake_by_ref(counted: &Arc<Self>) {
                counted.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let woken = Arc::new(Counted(AtomicUsize::new(0)));
        let waker = futures::task::waker(Arc::clone(&woken));
        let mut cx = Context::from_waker(&waker);
        let threshold = LogThreshold::new();
        let token = ProgressToken(rmcp::model::NumberOrString::Number(7));
        let (relay, cancel) = Relay::new("t", Some(token), &threshold, None, None);
        let relay = relay.unwrap();
        let mut ready = std::pin::pin!(relay.ready());
        assert!(
            ready.as_mut().poll(&mut cx).is_pending(),
            "nothing reported"
        );
        // The call reports (a first report is due at once) while the
        // relay's task polls it, then yields.
        let mut work = std::pin::pin!(async {
            cancel.report(report(0.0, Some(2.0)));
            std::future::pending::<()>().await;
        });
        let mut polled = std::pin::pin!(relay.polling(&mut work));
        assert!(polled.as_mut().poll(&mut cx).is_pending());
        assert_eq!(woken.0.load(Ordering::SeqCst), 0, "no wake from inside");
        let Poll::Ready(notes) = ready.as_mut().poll(&mut cx) else {
            panic!("the report waits for the relay, which looks next");
        };
        assert_eq!(notes.len(), 1);
        // Reported outside the relay's poll (the last report, due at once):
        // it wakes the relay.
        let mut ready = std::pin::pin!(relay.ready());
        assert!(ready.as_mut().poll(&mut cx).is_pending());
        cancel.report(report(2.0, Some(2.0)));
        assert_eq!(woken.0.load(Ordering::SeqCst), 1, "woken from outside");
        assert!(ready.as_mut().poll(&mut cx).is_ready());
    }

    #[test]
    fn only_a_notification_due_wakes_the_relay() {
        use futures::FutureExt as _;
        let threshold = LogThreshold::new();
        let token = ProgressToken(rmcp::model::NumberOrString::Number(7));
        let (relay, cancel) = Relay::new("t", Some(token), &threshold, None, None);
        let relay = relay.unwrap();
        assert!(relay.ready().now_or_never().is_none(), "nothing reported");
        let started = Instant::now();
        cancel.report(report(0.0, Some(100.0)));
        let first = relay
            .ready()
            .now_or_never()
            .expect("the first report is due");
        assert_eq!(first.len(), 1);
        cancel.report(report(50.0, Some(100.0)));
        cancel.report(report(60.0, Some(100.0)));
        // (Past the gap, as on a machine stalled that long, the last of
        // them would be due.)
        if started.elapsed() < PROGRESS_GAP {
            assert!(
                relay.ready().now_or_never().is_none(),
                "merged reports wait for their gap"
            );
        }
        // Once the gap has passed, the merged report goes out the next
        // time the relay is polled, with no report after it.
        std::thread::sleep(PROGRESS_GAP);
        let past = relay
            .ready()
            .now_or_never()
            .expect("the merged report is due once its gap has passed");
        let [ServerNotification::ProgressNotification(last)] = past.as_slice() else {
            panic!("{past:?}");
        };
        assert_eq!(last.params.progress, 60.0, "the latest merged report");
        assert!(relay.rest().is_empty(), "nothing waits after it");
        cancel.report(report(100.0, Some(100.0)));
        assert_eq!(
            relay.ready().now_or_never().map(|notes| notes.len()),
            Some(1),
            "a report that reaches its total goes out at once"
        );
    }

    /// Whether the clock's timer runs.
    fn ticking(seconds: &Seconds) -> bool {
        seconds.clock.ticking.load(Ordering::SeqCst)
    }

    #[tokio::test]
    async fn calls_count_seconds_from_one_timer_that_stops_when_none_listens() {
        let seconds = Seconds::default();
        assert!(!ticking(&seconds), "no timer before a call listens");
        let began = std::time::Instant::now();
        let (mut one, mut two) = (seconds.listen(), seconds.listen());
        assert!(ticking(&seconds));
        assert_eq!(one.next().await, 1);
        assert!(began.elapsed() >= PROGRESS_EVERY);
        assert_eq!(one.next().await, 2);
        assert!(
            began.elapsed() >= 2 * PROGRESS_EVERY,
            "ticks a second apart"
        );
        // The other call heard the same timer (ticks it did not wait for
        // are not counted).
        assert_eq!(two.next().await, 1);
        drop((one, two));
        // With no call listening, the timer stops within two ticks.
        let deadline = std::time::Instant::now() + 30 * PROGRESS_EVERY;
        while ticking(&seconds) {
            assert!(std::time::Instant::now() < deadline, "the timer runs on");
            tokio::time::sleep(PROGRESS_GAP).await;
        }
        // The next call to listen starts it again.
        let mut three = seconds.listen();
        assert!(ticking(&seconds));
        assert_eq!(three.next().await, 1);
    }

    #[test]
    fn the_timer_starts_again_on_another_runtime_when_its_own_is_gone() {
        let seconds = Seconds::default();
        let runtime = || {
            tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .unwrap()
        };
        let first = runtime();
        let listening = first.block_on(async { seconds.listen() });
        assert!(ticking(&seconds));
        // Its task, not yet run, goes with its runtime.
        drop(first);
        assert!(!ticking(&seconds), "a timer whose runtime is gone stopped");
        drop(listening);
        runtime().block_on(async { assert_eq!(seconds.listen().next().await, 1) });
        // Outside a runtime, no timer starts (and none is claimed).
        drop(seconds.listen());
        assert!(!ticking(&seconds));
    }

    #[tokio::test]
    async fn the_gap_opens_again_once_it_has_passed() {
        use std::sync::atomic::AtomicUsize;
        let threshold = LogThreshold::new();
        let token = ProgressToken(rmcp::model::NumberOrString::Number(7));
        let (relay, cancel) = Relay::new("t", Some(token), &threshold, None, None);
        let relay = relay.unwrap();
        let sent = AtomicUsize::new(0);
        let work = async {
            cancel.report(report(1.0, None));
            // At least the gap: the relay's timer opens it meanwhile.
            tokio::time::sleep(PROGRESS_GAP * 3).await;
            cancel.report(report(2.0, None));
            // The second report goes out when the call next yields (the
            // relay, looking then, sees the gap has passed), not at a
            // timer.
            for _ in 0..2 {
                if sent.load(Ordering::SeqCst) == 2 {
                    return true;
                }
                tokio::task::yield_now().await;
            }
            false
        };
        let send = |_| {
            sent.fetch_add(1, Ordering::SeqCst);
            std::future::ready(())
        };
        let seconds = Seconds::default().listen();
        assert!(
            relay.run(work, seconds, send).await,
            "the second report waited"
        );
        assert_eq!(sent.load(Ordering::SeqCst), 2, "nothing was left to send");
    }
}
