//! Work done aside: a thread of the sandbox's own that drops what a call
//! no longer needs (its store, whose memory reset is the costly part)
//! after the call has its result.
//!
//! One thread per sandbox, started with it and ended when the last handle
//! to it is dropped. Jobs run in the order they were sent. A job that
//! panics ends the thread; later jobs are then given back to their caller
//! to run itself.

use std::sync::mpsc::{self, Sender};

/// Something to run aside.
pub(crate) type Job = Box<dyn FnOnce() + Send>;

/// The thread's queue.
#[derive(Debug)]
pub(crate) struct Aside {
    jobs: Sender<Job>,
}

impl Aside {
    /// Starts the thread; `None` if the system has no thread to give.
    pub(crate) fn start() -> Option<Self> {
        let (jobs, queue) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("airlock-aside".into())
            .spawn(move || {
                for job in queue {
                    job();
                }
            })
            .ok()?;
        Some(Self { jobs })
    }

    /// Queues `job`. Costs a send and, when the thread is idle, waking it
    /// (a few microseconds). Gives `job` back if the thread has ended.
    pub(crate) fn run(&self, job: Job) -> Result<(), Job> {
        self.jobs.send(job).map_err(|unsent| unsent.0)
    }
}
