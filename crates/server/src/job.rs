//! A decoded request as the request queue holds it ([`Job`]) and how it
//! is sorted: its owner and kind ([`classify`], [`owner_of`]). This is the
//! layer above [`crate::scheduler`], which queues and runs any
//! [`Runnable`] without knowing the dispatcher.

use uascale_types::StatusCode;

use crate::context::ServiceContext;
use crate::dispatch::{Dispatched, Request, RequestClass};
use crate::scheduler::queue::Kind;
use crate::scheduler::{Owner, Runnable, Slot};
use crate::session::SessionKey;

/// One request of this server, ready to run on any worker.
#[derive(Debug)]
pub struct Job {
    /// Its context (state, channel, request id, clock, answer sink).
    pub ctx: ServiceContext,
    /// What is left to do.
    pub work: Work,
}

/// What a queued [`Job`] still has to do.
pub enum Work {
    /// Run the request's handler (it waited before it was dispatched).
    /// Boxed: a queue entry stays small.
    Request(Box<Request>),
    /// Drive the answer of a request already dispatched: an asynchronous
    /// node manager's future that found every worker busy.
    Answer {
        /// The request's requestHandle (what Cancel names it by).
        request_handle: u32,
        /// Produces the response message.
        future: crate::reply::BoxFuture<Vec<u8>>,
    },
}

impl std::fmt::Debug for Work {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Work::Request(r) => write!(f, "Work::Request({})", r.service_name()),
            Work::Answer { request_handle, .. } => {
                write!(f, "Work::Answer(handle {request_handle})")
            }
        }
    }
}

impl Job {
    /// A job that runs `request` in `ctx`.
    pub fn request(ctx: ServiceContext, request: Request) -> Job {
        Job {
            ctx,
            work: Work::Request(Box::new(request)),
        }
    }

    /// The requestHandle of the job's request.
    pub fn request_handle(&self) -> u32 {
        match &self.work {
            Work::Request(r) => r.header().request_handle,
            Work::Answer { request_handle, .. } => *request_handle,
        }
    }

    /// Runs the job under `slot` and sends its answer through the
    /// context's sink: now, from a task that holds the slot until an
    /// asynchronous node manager answers, or - a held Publish - when the
    /// subscription engine answers (the slot is then released at once, or
    /// kept until that answer without `decouple_held_publish_requests`).
    /// A job whose connection is gone is dropped unrun.
    pub fn run(mut self, slot: Slot) {
        let Some(sink) = self.ctx.sink.clone() else {
            return;
        };
        if !sink.is_open() {
            return;
        }
        let request_id = self.ctx.request_id;
        let request = match self.work {
            Work::Request(r) => *r,
            Work::Answer {
                request_handle,
                future,
            } => {
                sink.spawn_answer(request_id, request_handle, future, Some(slot));
                return;
            }
        };
        // It runs now, not when it arrived.
        let now = crate::state::clock();
        self.ctx.now = now.utc;
        self.ctx.instant = now.instant;
        let decoupled = self.ctx.state.scheduler.decoupled();
        match crate::dispatch::execute(&mut self.ctx, request) {
            Dispatched::Now(message) => {
                drop(slot);
                sink.send(request_id, message);
            }
            Dispatched::Later {
                request_handle,
                future,
                holds_worker,
            } => {
                let slot = if holds_worker {
                    Some(slot)
                } else {
                    drop(slot);
                    None
                };
                sink.spawn_answer(request_id, request_handle, future, slot);
            }
            Dispatched::Parked if !decoupled => sink.hold_until_answered(request_id, slot),
            Dispatched::Parked => drop(slot),
        }
    }
}

impl Runnable for Job {
    fn channel_id(&self) -> u32 {
        self.ctx.channel_id
    }

    fn request_handle(&self) -> u32 {
        Job::request_handle(self)
    }

    fn run(self: Box<Self>, slot: Slot) {
        Job::run(*self, slot);
    }

    fn cancelled(self: Box<Self>) {
        if let Some(sink) = &self.ctx.sink {
            let fault = crate::dispatch::encoded_fault(
                self.ctx.now,
                self.request_handle(),
                StatusCode::BadRequestCancelledByClient,
            );
            sink.send(self.ctx.request_id, fault);
        }
    }
}

/// The owner of a request whose session the dispatcher resolved (an
/// answer queued after dispatch), and its trust.
pub fn owner_of(ctx: &ServiceContext) -> (Owner, bool) {
    let sched = &ctx.state.scheduler;
    match &ctx.session {
        Some(s) => {
            let trusted = sched.trusts_anyone()
                && ctx
                    .state
                    .sessions
                    .with_key(&s.key, |s| sched.trusts(s))
                    .unwrap_or(false);
            (Owner::Session(s.key.clone()), trusted)
        }
        None => (Owner::Channel(ctx.channel_id), false),
    }
}

/// The owner, kind and trust of a request that is to wait (the session
/// is looked up; only done under contention).
pub fn classify(ctx: &ServiceContext, request: &Request) -> (Owner, Kind, bool) {
    let sched = &ctx.state.scheduler;
    let token = &request.header().authentication_token;
    let key = SessionKey::of(token);
    let trusted_profile = sched.trusts_anyone();
    let found = if token.is_null() {
        None
    } else {
        ctx.state
            .sessions
            .with_key(&key, |s| {
                let trusted = trusted_profile && sched.trusts(s);
                (s.channel_id, s.activated, trusted)
            })
            .ok()
    };
    let channel = ctx.channel_id;
    let on_this_channel = matches!(found, Some((c, _, _)) if c == channel);
    // The request's class, refined by its session: an ActivateSession of
    // an activated session on another channel is a reconnect.
    let kind = match request.class() {
        RequestClass::Bootstrap => match (request, found) {
            (Request::ActivateSession(_), Some((c, true, _))) if c != channel => Kind::Reconnect,
            _ => Kind::Bootstrap,
        },
        RequestClass::Reconnect => Kind::Reconnect,
        RequestClass::Control => Kind::Control,
        RequestClass::Discovery | RequestClass::Publish | RequestClass::Normal => Kind::Normal,
    };
    match found {
        Some((_, _, trusted)) if on_this_channel => (Owner::Session(key), kind, trusted),
        _ => {
            let trusted = trusted_profile
                && ctx
                    .channel
                    .remote_certificate
                    .as_ref()
                    .is_some_and(|c| sched.trusts_thumbprint(&c.thumbprint()));
            (Owner::Channel(channel), kind, trusted)
        }
    }
}
