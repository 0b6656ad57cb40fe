//! Bounded capture of a guest's stdout and stderr.
//!
//! A guest's output never reaches the host's own streams. It is kept in
//! memory up to a bound; a write past the bound traps the guest with
//! [`OutputLimitExceeded`], which the call reports as a typed error.

use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};

use bytes::Bytes;
use wasmtime_wasi::cli::{IsTerminal, StdoutStream};
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError, StreamResult};

/// Everything a guest wrote during one call besides its result: records
/// from the `log` interface, and its stdout and stderr (decoded lossily).
/// Each is bounded by [`Limits::max_output_bytes`](super::Limits).
///
/// Kept for failed calls as well as successful ones: it is often what
/// explains the failure.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GuestOutput {
    /// Records from the `log` interface, in order.
    pub logs: Vec<super::LogRecord>,
    /// What the guest wrote to stdout.
    pub stdout: String,
    /// What the guest wrote to stderr.
    pub stderr: String,
    /// What the guest asked for that the host refused, each with why (an
    /// HTTP request off the allowlist, to a non-public address, past the
    /// call's request or connection limit). Written by the host, never by
    /// the guest; at most [`MAX_REFUSALS`].
    pub refusals: Vec<String>,
    /// What it showed beside its result (the `show` import), checked;
    /// journaled and sent on only for a call that completed.
    pub shown: Vec<crate::spec::Shown>,
    /// The questions it asked its person (the `ask` import) and their
    /// answers.
    pub asked: Vec<crate::spec::Asked>,
    /// The completions it asked the model for and the replies.
    pub sampled: Vec<crate::spec::Sampled>,
    /// Its progress reports, in order (at most
    /// [`MAX_PROGRESS_REPORTS`](super::MAX_PROGRESS_REPORTS)); shown by
    /// `airlock call`, never journaled.
    pub progress: Vec<super::Progress>,
    /// What it read of the clocks and random numbers, journaled so that
    /// a replay gives it the same; played back, what ran short.
    pub tape: crate::spec::Tape,
}

impl GuestOutput {
    /// Whether the guest wrote nothing at all and nothing was refused.
    pub fn is_empty(&self) -> bool {
        self.logs.is_empty()
            && self.stdout.is_empty()
            && self.stderr.is_empty()
            && self.refusals.is_empty()
            && self.shown.is_empty()
            && self.asked.is_empty()
            && self.sampled.is_empty()
            && self.progress.is_empty()
    }
}

/// The most refusals a call keeps (the same refusal is kept once).
pub const MAX_REFUSALS: usize = 8;

/// Where the host notes, during a call, what it refused the guest and why
/// ([`GuestOutput::refusals`]): shared by the call's state and its
/// capabilities' hooks. Bounded: a guest that asks a million times costs
/// [`MAX_REFUSALS`] notes.
#[derive(Debug, Clone, Default)]
pub(crate) struct Refusals(Arc<Mutex<Refused>>);

#[derive(Debug, Default)]
struct Refused {
    notes: Vec<String>,
    /// A grant a request needed that cannot be honoured (an unset
    /// secret): the call fails with it, whatever the guest made of the
    /// refused request.
    grant: Option<crate::sandbox::GrantError>,
}

impl Refusals {
    /// Notes that a request needed `grant`, which cannot be honoured now
    /// (the first such is kept): the call fails with it.
    pub(crate) fn grant_missing(&self, grant: crate::sandbox::GrantError) {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        kept.grant.get_or_insert(grant);
    }

    /// The grant a request needed and did not have, if any.
    pub(crate) fn missing_grant(&self) -> Option<crate::sandbox::GrantError> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .grant
            .clone()
    }

    /// Notes a refusal (once, and only while fewer than [`MAX_REFUSALS`]
    /// are kept).
    pub(crate) fn note(&self, why: String) {
        let mut kept = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.notes.len() < MAX_REFUSALS && !kept.notes.contains(&why) {
            kept.notes.push(why);
        }
    }

    /// The refusals noted so far, leaving none.
    pub(crate) fn take(&self) -> Vec<String> {
        std::mem::take(&mut self.0.lock().unwrap_or_else(PoisonError::into_inner).notes)
    }
}

/// Which captured stream overflowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stream {
    /// The guest's stdout.
    Stdout,
    /// The guest's stderr.
    Stderr,
    /// The `log` interface.
    Log,
}

impl std::fmt::Display for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
            Stream::Log => "log",
        })
    }
}

/// The trap raised when a guest writes past its output bound.
#[derive(Debug, Clone, Copy, thiserror::Error)]
#[error("the tool wrote more than {limit} bytes to {stream}")]
pub(crate) struct OutputLimitExceeded {
    pub(crate) stream: Stream,
    pub(crate) limit: usize,
}

/// An in-memory stream with a byte bound, shared between the WASI context
/// that writes it and the host that reads it after the call.
#[derive(Debug, Clone)]
pub(crate) struct CapturedOutput {
    stream: Stream,
    limit: usize,
    buffer: Arc<Mutex<Vec<u8>>>,
}

impl CapturedOutput {
    pub(crate) fn new(stream: Stream, limit: usize) -> Self {
        Self {
            stream,
            limit,
            buffer: Arc::default(),
        }
    }

    /// Appends `bytes`, or refuses all of them if they would pass the bound.
    pub(crate) fn push(&self, bytes: &[u8]) -> Result<(), OutputLimitExceeded> {
        let mut buffer = self.buffer.lock().unwrap_or_else(PoisonError::into_inner);
        if buffer.len().saturating_add(bytes.len()) > self.limit {
            return Err(OutputLimitExceeded {
                stream: self.stream,
                limit: self.limit,
            });
        }
        buffer.extend_from_slice(bytes);
        Ok(())
    }

    /// What was written, decoded lossily (a guest may write any bytes).
    pub(crate) fn text(&self) -> String {
        let buffer = self.buffer.lock().unwrap_or_else(PoisonError::into_inner);
        String::from_utf8_lossy(&buffer).into_owned()
    }

    fn remaining(&self) -> usize {
        let buffer = self.buffer.lock().unwrap_or_else(PoisonError::into_inner);
        self.limit.saturating_sub(buffer.len())
    }
}

impl IsTerminal for CapturedOutput {
    fn is_terminal(&self) -> bool {
        false
    }
}

impl StdoutStream for CapturedOutput {
    fn p2_stream(&self) -> Box<dyn OutputStream> {
        Box::new(self.clone())
    }

    fn async_stream(&self) -> Box<dyn tokio::io::AsyncWrite + Send + Sync> {
        Box::new(self.clone())
    }
}

#[wasmtime_wasi::async_trait]
impl Pollable for CapturedOutput {
    async fn ready(&mut self) {}
}

impl OutputStream for CapturedOutput {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.push(&bytes)
            .map_err(|e| StreamError::Trap(wasmtime::Error::new(e)))
    }

    fn flush(&mut self) -> StreamResult<()> {
        Ok(())
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        // Offer at least one byte even when full, so the guest's next write
        // reaches `write` and traps with a clear error instead of blocking.
        Ok(self.remaining().max(1))
    }
}

impl tokio::io::AsyncWrite for CapturedOutput {
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Poll::Ready(
            self.push(buf)
                .map(|()| buf.len())
                .map_err(std::io::Error::other),
        )
    }

    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
