//! The fate of a decoded request, decided in one place: run now, queue,
//! park, hold a worker, answer later, or shed ([`submit`] for a request
//! as it arrives, [`Job::run`] for one a worker took from the queue; both
//! end in [`settle`]).

use std::sync::Arc;

use super::channel::Channel;
use crate::admission::address::AddressKey;
use crate::context::ServiceContext;
use crate::dispatch::{dispatch, Dispatched, Request, RequestClass};
use crate::reply::{BoxFuture, ResponseSink};
use crate::scheduler::queue::Kind;
use crate::scheduler::{Owner, Runnable, Slot, Spawn};
use crate::session::SessionKey;
use futures_util::future::{AbortHandle, Abortable};

/// What became of a request.
pub enum Submit {
    /// Its answer, to send now.
    Answer(Vec<u8>),
    /// Its answer comes from this task, for the runtime to run; the task
    /// answers through the channel (and Cancel or the channel's teardown
    /// abort it).
    Spawn(Spawn),
    /// It waits in the request queue; a worker takes it.
    Queued,
    /// A handler keeps its responder (a held Publish); the subscription
    /// engine answers it.
    Parked,
}

impl std::fmt::Debug for Submit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Submit::Answer(m) => write!(f, "Submit::Answer({} bytes)", m.len()),
            Submit::Spawn(_) => f.write_str("Submit::Spawn"),
            Submit::Queued => f.write_str("Submit::Queued"),
            Submit::Parked => f.write_str("Submit::Parked"),
        }
    }
}

/// Decides what a request that just arrived on `ch` becomes (`ctx` holds
/// its request id and the clock reading of its arrival). While nothing
/// waits in the request queue it runs at once: what completes takes no
/// worker; an answer that waits (an asynchronous node manager) takes a
/// worker's slot, or queues for one when every worker is busy. Once
/// anything waits, it queues behind - or is shed with a hint. In the
/// legacy mode (`decouple_held_publish_requests = false`) every request
/// takes a slot before it runs.
pub fn submit(ctx: &mut ServiceContext, ch: &Arc<Channel>, body: &[u8]) -> Submit {
    let scheduler = Arc::clone(&ctx.state.scheduler);
    if scheduler.has_waiting() {
        return enqueue(ctx, ch, body);
    }
    if !scheduler.decoupled() {
        let Some(slot) = scheduler.try_slot() else {
            return enqueue(ctx, ch, body);
        };
        return match dispatch(ctx, body) {
            Dispatched::Now(message) => Submit::Answer(message),
            other => settle(ctx, ch, other, Some(slot.into_owned())),
        };
    }
    match dispatch(ctx, body) {
        Dispatched::Later {
            request_handle,
            future,
            holds_worker: true,
        } => match scheduler.try_slot() {
            Some(slot) => Submit::Spawn(spawn_answer(
                ch,
                ctx.request_id,
                request_handle,
                future,
                Some(slot.into_owned()),
            )),
            None => {
                // Never refused: its work has started.
                let (owner, _) = owner_of(ctx);
                ch.queued(ctx.request_id, request_handle);
                let job = Job {
                    ctx: ctx.clone(),
                    channel: Arc::clone(ch),
                    work: Work::Answer {
                        request_handle,
                        future,
                    },
                };
                scheduler.offer_started(owner, body.len(), Box::new(job));
                Submit::Queued
            }
        },
        other => settle(ctx, ch, other, None),
    }
}

/// What a dispatched request becomes, `slot` being the worker it ran under
/// (if it took one): an answer now; a task that answers later and keeps
/// the slot while it does the request's work; a held Publish that keeps
/// the slot in the legacy mode.
fn settle(
    ctx: &ServiceContext,
    ch: &Arc<Channel>,
    dispatched: Dispatched,
    slot: Option<Slot>,
) -> Submit {
    match dispatched {
        Dispatched::Now(message) => Submit::Answer(message),
        Dispatched::Later {
            request_handle,
            future,
            holds_worker,
        } => {
            let slot = slot.filter(|_| holds_worker);
            Submit::Spawn(spawn_answer(
                ch,
                ctx.request_id,
                request_handle,
                future,
                slot,
            ))
        }
        Dispatched::Parked => {
            if let Some(slot) = slot.filter(|_| !ctx.state.scheduler.decoupled()) {
                ch.hold(ctx.request_id, 0, slot);
            }
            Submit::Parked
        }
    }
}

/// The task that drives `future` - the answer to `request_id` - and sends
/// what it yields, unless a Cancel or the channel's teardown came first;
/// `slot` is given back when it completes or is aborted.
fn spawn_answer(
    ch: &Arc<Channel>,
    request_id: u32,
    request_handle: u32,
    future: BoxFuture<Vec<u8>>,
    slot: Option<Slot>,
) -> Spawn {
    let (abort, registration) = AbortHandle::new_pair();
    ch.running(request_id, request_handle, abort);
    let to = Arc::clone(ch);
    let answer = async move {
        let message = future.await;
        drop(slot);
        if to.finished(request_id) {
            to.send(request_id, message);
        }
    };
    Box::pin(async move {
        let _ = Abortable::new(answer, registration).await;
    })
}

/// Queues a request that cannot run at once, or answers it: a ServiceFault
/// when it does not decode, `BadServerTooBusy` with a hint when the queue
/// sheds it.
fn enqueue(ctx: &mut ServiceContext, ch: &Arc<Channel>, body: &[u8]) -> Submit {
    let state = Arc::clone(&ctx.state);
    let request = match Request::decode(body, &state.channel_config.decode) {
        Ok(r) => r,
        Err(e) => {
            // Cheap to answer, and nothing to queue.
            tracing::debug!(error = %e, "request did not decode");
            return match crate::dispatch::dispatch_general(ctx, body) {
                Dispatched::Now(message) => Submit::Answer(message),
                _ => Submit::Parked,
            };
        }
    };
    let (owner, kind, trusted) = classify(ctx, &request);
    let handle = request.header().request_handle;
    let service = request.service();
    let request_id = ctx.request_id;
    ch.queued(request_id, handle);
    let job = Box::new(Job::request(ctx.clone(), Arc::clone(ch), request));
    match state
        .scheduler
        .offer(owner, kind, trusted, body.len(), job, ctx.instant)
    {
        Ok(_) => Submit::Queued,
        Err(refused) => {
            ch.started(request_id);
            let e = crate::error::ServiceError::shed(refused.shed);
            state.metrics.requests.record(service, e.status_code());
            state.metrics.shed(&refused.shed);
            let mut out = Vec::with_capacity(128);
            uascale_types::encode_message(&e.to_fault(ctx.now, handle), &mut out);
            Submit::Answer(out)
        }
    }
}

/// One request of this server waiting for a worker.
#[derive(Debug)]
pub struct Job {
    ctx: ServiceContext,
    channel: Arc<Channel>,
    work: Work,
}

/// What a queued [`Job`] still has to do.
enum Work {
    /// Run the request's handler (it waited before it was dispatched).
    /// Boxed: a queue entry stays small.
    Request(Box<Request>),
    /// Drive the answer of a request already dispatched: an asynchronous
    /// node manager's future that found every worker busy.
    Answer {
        request_handle: u32,
        future: BoxFuture<Vec<u8>>,
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
    fn request(ctx: ServiceContext, channel: Arc<Channel>, request: Request) -> Job {
        Job {
            ctx,
            channel,
            work: Work::Request(Box::new(request)),
        }
    }
}

impl Runnable for Job {
    fn channel_id(&self) -> u32 {
        self.ctx.channel_id
    }

    fn request_id(&self) -> u32 {
        self.ctx.request_id
    }

    /// Runs the request under `slot` at `now` (it runs now, not when it
    /// arrived) and sends its answer through the channel - or hands back
    /// the task that will. A job that is no longer outstanding (cancelled,
    /// its channel gone) is dropped unrun.
    fn run(self: Box<Self>, slot: Slot, now: uascale_proto::Now) -> Option<Spawn> {
        let Job {
            mut ctx,
            channel,
            work,
        } = *self;
        let request_id = ctx.request_id;
        if !channel.started(request_id) {
            return None;
        }
        let request = match work {
            Work::Request(r) => *r,
            Work::Answer {
                request_handle,
                future,
            } => {
                return Some(spawn_answer(
                    &channel,
                    request_id,
                    request_handle,
                    future,
                    Some(slot),
                ))
            }
        };
        ctx.now = now.utc;
        ctx.instant = now.instant;
        let dispatched = crate::dispatch::execute(&mut ctx, request);
        match settle(&ctx, &channel, dispatched, Some(slot)) {
            Submit::Answer(message) => {
                channel.send(request_id, message);
                None
            }
            Submit::Spawn(task) => Some(task),
            Submit::Queued | Submit::Parked => None,
        }
    }
}

/// The owner of a request whose session the dispatcher resolved (an
/// answer queued after dispatch), and its trust.
fn owner_of(ctx: &ServiceContext) -> (Owner, bool) {
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
        None => (sessionless(ctx), false),
    }
}

/// The owner of a request without a session: its channel, or for a
/// request on a logical channel of its own (opc.https) its source address.
fn sessionless(ctx: &ServiceContext) -> Owner {
    match ctx.peer_ip.filter(|_| ctx.owned_by_address) {
        Some(ip) => Owner::Address(AddressKey::of(ip)),
        None => Owner::Channel(ctx.channel_id),
    }
}

/// The owner, kind and trust of a request that is to wait (the session
/// is looked up; only done under contention).
fn classify(ctx: &ServiceContext, request: &Request) -> (Owner, Kind, bool) {
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
            (sessionless(ctx), kind, trusted)
        }
    }
}
