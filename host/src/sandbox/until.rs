//! Bounding a call's future by its deadline and its cancellation, at no
//! cost to the calls that never wait.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::time::{Instant, Sleep};

use super::CancelToken;

/// Why the host stopped a call before it ended: the one stop type, whether
/// the host's timer stopped a guest waiting on the host ([`until`]) or the
/// epoch check stopped one running wasm (as the trap's error).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub(crate) enum Stop {
    /// The deadline passed.
    #[error("the call ran past its deadline")]
    Deadline,
    /// The call's token was cancelled.
    #[error("the call was cancelled")]
    Cancelled,
}

/// Runs `work` to its end, unless `deadline` passes or `cancel` fires
/// first (either may be absent), polling it inside `span` (what it logs is
/// the call's). Work cancelled before it begins is never polled.
///
/// Cost: the timer and the cancellation waiter (a lock each, in tokio's
/// timer wheel and in the token, and an allocation each) are set up only
/// once `work` has to wait. Work that ends in its first poll, as a tool
/// call that computes and returns without awaiting the host does (nearly
/// all of them), pays one atomic load. Work that waits is stopped exactly
/// as if both had been set up from the start: the deadline is the instant
/// given, not one counted from the first wait.
///
/// The returned future holds `work` in place beside a few words: a call's
/// future is kilobytes, and it is moved into this one once, not copied
/// again into an async body's locals.
pub(crate) fn until<'a, F: Future>(
    work: F,
    deadline: Option<Instant>,
    cancel: Option<&'a CancelToken>,
    span: &'a tracing::Span,
) -> Until<'a, F> {
    Until {
        work,
        deadline,
        cancel,
        span,
        started: false,
        timer: None,
        waiter: None,
    }
}

pin_project_lite::pin_project! {
    /// [`until`]'s future.
    pub(crate) struct Until<'a, F> {
        #[pin]
        work: F,
        deadline: Option<Instant>,
        cancel: Option<&'a CancelToken>,
        span: &'a tracing::Span,
        // Whether `work` was polled (the token is checked before that).
        started: bool,
        // Set up at the first wait.
        timer: Option<Pin<Box<Sleep>>>,
        waiter: Option<Pin<Box<dyn Future<Output = ()> + Send + 'a>>>,
    }
}

impl<F: Future> Future for Until<'_, F> {
    type Output = Result<F::Output, Stop>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        if !*this.started {
            if this.cancel.is_some_and(CancelToken::is_cancelled) {
                return Poll::Ready(Err(Stop::Cancelled));
            }
            *this.started = true;
        }
        let work = this.work;
        if let Poll::Ready(output) = this.span.in_scope(|| work.poll(cx)) {
            return Poll::Ready(Ok(output));
        }
        if let Some(token) = *this.cancel {
            let waiting = this
                .waiter
                .get_or_insert_with(|| Box::pin(token.cancelled()));
            if waiting.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(Stop::Cancelled));
            }
        }
        if let Some(at) = *this.deadline {
            let sleeping = this
                .timer
                .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(at)));
            if sleeping.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Err(Stop::Deadline));
            }
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn none() -> tracing::Span {
        tracing::Span::none()
    }

    #[tokio::test]
    async fn work_that_ends_at_once_is_not_bounded() {
        let past = Instant::now() - Duration::from_secs(1);
        let cancel = CancelToken::new();
        assert_eq!(
            until(async { 7 }, Some(past), Some(&cancel), &none()).await,
            Ok(7)
        );
    }

    #[tokio::test]
    async fn work_cancelled_before_it_begins_never_runs() {
        let cancel = CancelToken::new();
        cancel.cancel();
        let mut ran = false;
        let stopped = until(async { ran = true }, None, Some(&cancel), &none()).await;
        assert_eq!(stopped, Err(Stop::Cancelled));
        assert!(!ran);
    }

    #[tokio::test]
    async fn work_that_waits_stops_at_the_deadline_given() {
        let deadline = Instant::now() + Duration::from_millis(20);
        let stopped = until(std::future::pending::<()>(), Some(deadline), None, &none()).await;
        assert_eq!(stopped, Err(Stop::Deadline));
        assert!(Instant::now() >= deadline);
    }

    #[tokio::test]
    async fn work_that_waits_stops_when_cancelled() {
        let cancel = CancelToken::new();
        let canceller = cancel.clone();
        let work = async {
            tokio::task::yield_now().await;
            canceller.cancel();
            std::future::pending::<()>().await;
        };
        assert_eq!(
            until(work, None, Some(&cancel), &none()).await,
            Err(Stop::Cancelled)
        );
    }
}
