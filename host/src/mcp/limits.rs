//! What one user may use of a server at once (`[mcp.limits]`): tool calls
//! running, calls started in the last minute, MCP sessions open. Each is
//! counted per user id, in this process: a server of many hosts limits
//! each host's share. Beside them, what runs on a server's tools for all
//! users together ([`ToolSet::running`](super::ToolSet::running)), for a
//! server that stops to wait for.
//!
//! A call or session holds a permit while it runs or lives; dropping the
//! permit gives its place back. A refused call has not started, so
//! nothing of it is journaled and nothing committed is touched. Cost per
//! call: one lock of a map, and with a per-minute limit a queue of at
//! most that many start times.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use crate::policy::UserLimits;

/// The window of `calls_per_minute`.
const MINUTE: Duration = Duration::from_secs(60);

/// A limit a user reached: the request is refused, nothing ran.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LimitError {
    /// `concurrent_calls` calls of the user run now.
    #[error(
        "{user}: {limit} calls already running, the most one user may run at once \
         ([mcp.limits] concurrent_calls); try again when one ends"
    )]
    Concurrent {
        /// The user.
        user: String,
        /// The limit.
        limit: usize,
    },
    /// `calls_per_minute` calls of the user started within the last
    /// minute.
    #[error(
        "{user}: {limit} calls started within the last minute, the most one user may start \
         ([mcp.limits] calls_per_minute); try again in {} s", .retry_after.as_secs().max(1)
    )]
    PerMinute {
        /// The user.
        user: String,
        /// The limit.
        limit: u32,
        /// When the oldest of them leaves the window.
        retry_after: Duration,
    },
    /// `open_sessions` MCP sessions of the user are open.
    #[error(
        "{user}: {limit} MCP sessions already open, the most one user may hold \
         ([mcp.limits] open_sessions); end one (DELETE) or let one idle out"
    )]
    Sessions {
        /// The user.
        user: String,
        /// The limit.
        limit: usize,
    },
}

/// Counts what each user uses, against [`UserLimits`].
#[derive(Debug)]
pub struct UserLimiter {
    limits: UserLimits,
    users: Mutex<HashMap<String, Usage>>,
}

#[derive(Debug, Default)]
struct Usage {
    running: usize,
    started: VecDeque<Instant>,
    sessions: usize,
}

impl Usage {
    fn idle(&self) -> bool {
        self.running == 0 && self.started.is_empty() && self.sessions == 0
    }
}

/// What a permit holds a place in.
#[derive(Debug, Clone, Copy)]
enum Place {
    Call,
    Session,
}

/// A place held in a user's count, given back when dropped.
#[derive(Debug)]
pub struct Permit {
    limiter: Arc<UserLimiter>,
    user: String,
    place: Place,
}

impl Drop for Permit {
    fn drop(&mut self) {
        let mut users = self.limiter.lock();
        if let Some(usage) = users.get_mut(&self.user) {
            match self.place {
                Place::Call => usage.running = usage.running.saturating_sub(1),
                Place::Session => usage.sessions = usage.sessions.saturating_sub(1),
            }
            forget_old(usage, Instant::now());
            if usage.idle() {
                users.remove(&self.user);
            }
        }
    }
}

/// Drops the start times that left the minute's window.
fn forget_old(usage: &mut Usage, now: Instant) {
    while usage
        .started
        .front()
        .is_some_and(|at| now.saturating_duration_since(*at) >= MINUTE)
    {
        usage.started.pop_front();
    }
}

impl UserLimiter {
    /// Counts against `limits`.
    pub fn new(limits: UserLimits) -> Arc<Self> {
        Arc::new(Self {
            limits,
            users: Mutex::default(),
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Usage>> {
        self.users.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for one call of `user`, if neither of their call limits is
    /// reached.
    pub fn start_call(self: &Arc<Self>, user: &str) -> Result<Permit, LimitError> {
        let now = Instant::now();
        let mut users = self.lock();
        let usage = users.entry(user.to_owned()).or_default();
        forget_old(usage, now);
        if let Some(limit) = self.limits.concurrent_calls
            && usage.running >= limit
        {
            return Err(LimitError::Concurrent {
                user: user.to_owned(),
                limit,
            });
        }
        if let Some(limit) = self.limits.calls_per_minute {
            if usage.started.len() >= limit as usize {
                let oldest = usage.started.front().copied().unwrap_or(now);
                return Err(LimitError::PerMinute {
                    user: user.to_owned(),
                    limit,
                    retry_after: MINUTE.saturating_sub(now.saturating_duration_since(oldest)),
                });
            }
            usage.started.push_back(now);
        }
        usage.running += 1;
        Ok(self.permit(user, Place::Call))
    }

    /// A place for one more MCP session of `user`, if they hold fewer than
    /// `open_sessions`.
    pub fn open_session(self: &Arc<Self>, user: &str) -> Result<Permit, LimitError> {
        let mut users = self.lock();
        let usage = users.entry(user.to_owned()).or_default();
        if let Some(limit) = self.limits.open_sessions
            && usage.sessions >= limit
        {
            return Err(LimitError::Sessions {
                user: user.to_owned(),
                limit,
            });
        }
        usage.sessions += 1;
        Ok(self.permit(user, Place::Session))
    }

    fn permit(self: &Arc<Self>, user: &str, place: Place) -> Permit {
        Permit {
            limiter: Arc::clone(self),
            user: user.to_owned(),
            place,
        }
    }
}

/// The work running on a server's tools in this process, for all users
/// together (calls, tasks, calls whose client went away, reads, prompts,
/// completions), counted so that a stopping server can wait for it to
/// end. Cost: a lock at each start and end, and a wake only when someone
/// waits.
#[derive(Debug)]
pub(super) struct Running(Arc<tokio::sync::watch::Sender<usize>>);

impl Default for Running {
    fn default() -> Self {
        Self(Arc::new(tokio::sync::watch::Sender::new(0)))
    }
}

impl Running {
    /// Counts one more piece of work until the guard is dropped.
    pub(super) fn start(&self) -> Busy {
        // Nobody waits for a count to grow.
        self.0.send_if_modified(|n| {
            *n += 1;
            false
        });
        Busy(Arc::clone(&self.0))
    }

    /// How many run now.
    pub(super) fn count(&self) -> usize {
        *self.0.borrow()
    }

    /// Waits until none runs: at once when none does; work that starts
    /// meanwhile is waited for too.
    pub(super) async fn ended(&self) {
        let mut count = self.0.subscribe();
        // The sender lives as long as `self`: never an error.
        let _ = count.wait_for(|n| *n == 0).await;
    }
}

/// One piece of work counted in [`Running`] while it is held.
#[derive(Debug)]
pub(super) struct Busy(Arc<tokio::sync::watch::Sender<usize>>);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.send_if_modified(|n| {
            *n = n.saturating_sub(1);
            *n == 0
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_place_comes_back_when_its_permit_drops() {
        let limiter = UserLimiter::new(UserLimits {
            concurrent_calls: Some(2),
            calls_per_minute: None,
            open_sessions: Some(1),
        });
        let a = limiter.start_call("ann").unwrap();
        let _b = limiter.start_call("ann").unwrap();
        let refused = limiter.start_call("ann").unwrap_err();
        assert!(matches!(refused, LimitError::Concurrent { limit: 2, .. }));
        // Another user is not held back by ann.
        let _other = limiter.start_call("bob").unwrap();
        drop(a);
        let _c = limiter.start_call("ann").unwrap();
        let session = limiter.open_session("ann").unwrap();
        assert!(limiter.open_session("ann").is_err());
        drop(session);
        assert!(limiter.open_session("ann").is_ok());
    }

    #[test]
    fn a_minute_holds_at_most_its_limit_of_starts() {
        let limiter = UserLimiter::new(UserLimits {
            concurrent_calls: None,
            calls_per_minute: Some(3),
            open_sessions: None,
        });
        for _ in 0..3 {
            drop(limiter.start_call("ann").unwrap());
        }
        let refused = limiter.start_call("ann").unwrap_err();
        let LimitError::PerMinute { retry_after, .. } = refused else {
            panic!("{refused:?}");
        };
        assert!(retry_after <= MINUTE);
        assert!(refused_text(&limiter).contains("calls_per_minute"));
        // The starts a minute ago have left the window.
        let mut users = limiter.lock();
        let usage = users.get_mut("ann").unwrap();
        let past = Instant::now().checked_sub(MINUTE).unwrap();
        usage.started.iter_mut().for_each(|at| *at = past);
        drop(users);
        assert!(limiter.start_call("ann").is_ok());
    }

    fn refused_text(limiter: &Arc<UserLimiter>) -> String {
        limiter.start_call("ann").unwrap_err().to_string()
    }

    #[tokio::test]
    async fn a_stopping_server_waits_for_the_work_running() {
        let running = Running::default();
        // Nothing runs: no wait.
        running.ended().await;
        let (first, second) = (running.start(), running.start());
        assert_eq!(running.count(), 2);
        let mut ended = std::pin::pin!(running.ended());
        assert!(futures::poll!(ended.as_mut()).is_pending());
        drop(first);
        assert!(futures::poll!(ended.as_mut()).is_pending());
        // Work that starts while it waits is waited for too.
        let third = running.start();
        drop(second);
        assert!(futures::poll!(ended.as_mut()).is_pending());
        drop(third);
        assert_eq!(running.count(), 0);
        ended.await;
    }
}
