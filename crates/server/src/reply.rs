//! Responses that are sent later than the request was handled: a Publish
//! parked until there is something to publish, a Read whose node manager
//! answers asynchronously.
//!
//! A handler that cannot answer at once takes a [`Responder`] from the
//! [`ServiceContext`](crate::context::ServiceContext) (the connection the
//! request came on plus the request id) and keeps it; the request then holds
//! no worker while it waits (docs/scalability.md §4). Whoever answers later calls
//! [`Responder::send`]; if the connection has gone meanwhile, that returns
//! false and nothing else happens.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use uascale_types::{encode_message, DateTime, DynStructure, StatusCode};

/// A future that can be moved to another task.
pub type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send + 'static>>;

/// Where the responses of one connection go (implemented by the
/// endpoint's [`crate::endpoint::Channel`]: a queue the connection's task
/// writes out).
pub trait ResponseSink: Send + Sync + std::fmt::Debug + 'static {
    /// Queues `message` (encoding id + body) as the answer to `request_id`;
    /// false when the connection is gone.
    fn send(&self, request_id: u32, message: Vec<u8>) -> bool;

    /// False once the connection is gone (a request still waiting for a
    /// worker is then dropped unrun).
    fn is_open(&self) -> bool {
        true
    }

    /// Cancels the outstanding requests named `request_handle` - those
    /// waiting in `scheduler`'s queue and those still running - each then
    /// answered `BadRequestCancelledByClient` at `now`; how many there
    /// were. A sink with nothing outstanding cancels none.
    fn cancel(
        &self,
        scheduler: &crate::scheduler::Scheduler,
        request_handle: u32,
        now: DateTime,
    ) -> u32 {
        let _ = (scheduler, request_handle, now);
        0
    }
}

/// A service's answer: now, or from a future that the network layer runs
/// without holding up the connection (asynchronous node managers).
pub enum Answer<T> {
    /// The response.
    Now(T),
    /// The response, once the future completes.
    Later(BoxFuture<Result<T, crate::error::ServiceError>>),
}

impl<T> std::fmt::Debug for Answer<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Answer::Now(_) => "Answer::Now",
            Answer::Later(_) => "Answer::Later",
        })
    }
}

/// The right to answer one request later.
#[derive(Clone)]
pub struct Responder {
    sink: Arc<dyn ResponseSink>,
    channel_id: u32,
    request_id: u32,
    request_handle: u32,
    /// The place of a held Publish in the parked stage, given back when
    /// the last copy of the responder is gone.
    place: Option<Arc<crate::scheduler::ParkedPlace>>,
}

impl std::fmt::Debug for Responder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Responder")
            .field("channel_id", &self.channel_id)
            .field("request_id", &self.request_id)
            .field("request_handle", &self.request_handle)
            .finish()
    }
}

impl Responder {
    /// A responder for `request_id` on the connection behind `sink`.
    pub fn new(
        sink: Arc<dyn ResponseSink>,
        channel_id: u32,
        request_id: u32,
        request_handle: u32,
    ) -> Self {
        Responder {
            sink,
            channel_id,
            request_id,
            request_handle,
            place: None,
        }
    }

    /// This responder, holding `place` in the parked stage until it answers
    /// (or is dropped unanswered).
    pub fn holding(mut self, place: crate::scheduler::ParkedPlace) -> Self {
        self.place = Some(Arc::new(place));
        self
    }

    /// The secure channel the request came on.
    pub fn channel_id(&self) -> u32 {
        self.channel_id
    }

    /// The request id (of the secure channel layer) it answers.
    pub fn request_id(&self) -> u32 {
        self.request_id
    }

    /// The RequestHeader's requestHandle, to put in the response header.
    pub fn request_handle(&self) -> u32 {
        self.request_handle
    }

    /// Sends the response; false when the connection is gone.
    pub fn send(self, response: &dyn DynStructure) -> bool {
        let mut out = Vec::with_capacity(256);
        encode_message(response, &mut out);
        self.sink.send(self.request_id, out)
    }

    /// Sends an already encoded response message.
    pub fn send_encoded(self, message: Vec<u8>) -> bool {
        self.sink.send(self.request_id, message)
    }

    /// Answers with a ServiceFault.
    pub fn fault(self, now: DateTime, status: StatusCode) -> bool {
        let fault = crate::error::service_fault(now, self.request_handle, status);
        self.send(&fault)
    }
}

/// The server's subscriptions; a parked Publish holds the [`Responder`]
/// its answer goes through.
pub type SubscriptionRegistry = crate::subscription::registry::Registry<Responder>;

impl crate::subscription::registry::PublishSink for Responder {
    fn deliver(self, answer: crate::subscription::Answer) -> bool {
        match answer {
            crate::subscription::Answer::Publish(p) => self.send(p.as_ref()),
            crate::subscription::Answer::Fault { status, .. } => self.fault(
                uascale_types::DateTime::from_system_time(std::time::SystemTime::now()),
                status,
            ),
        }
    }
}

/// Waits for every future and returns their outputs in order. The futures
/// make progress concurrently (each is polled when woken), which is what a
/// Read of several asynchronously served nodes wants.
pub async fn join_all<T: Send + 'static>(futures: Vec<BoxFuture<T>>) -> Vec<T> {
    JoinAll {
        slots: futures.into_iter().map(Slot::Pending).collect(),
    }
    .await
}

enum Slot<T> {
    Pending(BoxFuture<T>),
    Done(Option<T>),
}

struct JoinAll<T> {
    slots: Vec<Slot<T>>,
}

// The futures are boxed and outputs are never pinned: moving is fine.
impl<T> Unpin for JoinAll<T> {}

impl<T> Future for JoinAll<T> {
    type Output = Vec<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Vec<T>> {
        let this = self.get_mut();
        let mut all_done = true;
        for slot in this.slots.iter_mut() {
            if let Slot::Pending(f) = slot {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *slot = Slot::Done(Some(v)),
                    std::task::Poll::Pending => all_done = false,
                }
            }
        }
        if !all_done {
            return std::task::Poll::Pending;
        }
        let out = this
            .slots
            .iter_mut()
            .filter_map(|s| match s {
                Slot::Done(v) => v.take(),
                Slot::Pending(_) => None,
            })
            .collect();
        std::task::Poll::Ready(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[derive(Default, Debug)]
    struct Collect(Mutex<Vec<(u32, Vec<u8>)>>, bool);

    impl ResponseSink for Collect {
        fn send(&self, request_id: u32, message: Vec<u8>) -> bool {
            if self.1 {
                return false;
            }
            self.0.lock().unwrap().push((request_id, message));
            true
        }
    }

    #[test]
    fn a_responder_answers_its_request_once() {
        let sink = Arc::new(Collect::default());
        let r = Responder::new(sink.clone(), 3, 41, 7);
        assert_eq!(
            (r.channel_id(), r.request_id(), r.request_handle()),
            (3, 41, 7)
        );
        assert!(r.fault(DateTime::from_ticks(5), StatusCode::BadTimeout));
        let got = sink.0.lock().unwrap();
        assert_eq!(got.len(), 1);
        assert_eq!(got[0].0, 41);
        let limits = uascale_types::DecodeLimits::default();
        let m = uascale_types::decode_message(
            &mut uascale_types::Reader::new(&got[0].1, &limits).unwrap(),
        )
        .unwrap();
        let f = m
            .as_any()
            .downcast_ref::<uascale_types::ServiceFault>()
            .unwrap();
        assert_eq!(f.response_header.request_handle, 7);
        assert_eq!(f.response_header.service_result, StatusCode::BadTimeout);
    }

    #[test]
    fn a_gone_connection_is_reported() {
        let sink = Arc::new(Collect(Mutex::default(), true));
        let r = Responder::new(sink, 1, 1, 1);
        assert!(!r.fault(DateTime::from_ticks(5), StatusCode::BadTimeout));
    }

    #[test]
    fn join_all_keeps_the_order() {
        // A minimal executor: the futures here are ready at once.
        let futs: Vec<BoxFuture<u32>> = (0..5u32)
            .map(|i| Box::pin(async move { i * 2 }) as BoxFuture<u32>)
            .collect();
        let mut f = Box::pin(join_all(futs));
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(v) => assert_eq!(v, vec![0, 2, 4, 6, 8]),
            std::task::Poll::Pending => panic!("all were ready"),
        }
    }
}
