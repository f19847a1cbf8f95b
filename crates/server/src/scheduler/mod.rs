//! The request scheduler (SCALABILITY.md §3-4): where a decoded request
//! waits for a worker, and who waits behind whom.
//!
//! What is here now: the unit of work, a [`Job`] - an owned, `Send`
//! request context and its decoded [`Request`] - which a connection runs
//! at once ([`Job::run`]) today. With the request-queue issue, jobs wait
//! here in lanes per owner (the session, or the channel before a session
//! exists) sorted by [`Request::class`], with protected entries for
//! bootstrap, reconnect and control requests and a parked stage for held
//! Publishes.

use crate::context::ServiceContext;
use crate::dispatch::{Dispatched, Request};

/// One request, ready to run on any worker.
#[derive(Debug)]
pub struct Job {
    /// Its context (state, channel, request id, clock, answer sink).
    pub ctx: ServiceContext,
    /// The decoded request.
    pub request: Request,
}

impl Job {
    /// Runs the request's handler.
    pub fn run(mut self) -> Dispatched {
        crate::dispatch::execute(&mut self.ctx, self.request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn assert_send<T: Send + 'static>() {}

    /// A job can be queued and run on another task or thread.
    #[test]
    fn a_job_is_send() {
        assert_send::<Job>();
    }
}
