//! A wait that needs no runtime: the first poll registers the deadline
//! with one timer thread of the server's, which wakes the task then. For
//! the waits the sans-IO parts of the server must bound themselves (the
//! demo's slow nodes, the establishment stage's waiting room), where no
//! shell timer is at hand.

/// A wait of `delay` (or until a deadline) that needs no runtime: the
/// first poll registers the deadline with the timer thread, which wakes
/// the task then (a zero delay yields once).
#[derive(Debug)]
pub struct Delay {
    delay: std::time::Duration,
    deadline: Option<std::time::Instant>,
}

impl Delay {
    /// A wait of `delay` from its first poll.
    pub fn after(delay: std::time::Duration) -> Self {
        Delay {
            delay,
            deadline: None,
        }
    }

    /// A wait until `at`.
    pub fn until(at: std::time::Instant) -> Self {
        Delay {
            delay: std::time::Duration::ZERO,
            deadline: Some(at),
        }
    }
}

impl std::future::Future for Delay {
    type Output = ();

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<()> {
        let now = std::time::Instant::now();
        match self.deadline {
            Some(at) if now >= at => std::task::Poll::Ready(()),
            Some(at) => {
                timer::wake_at(at, cx.waker().clone());
                std::task::Poll::Pending
            }
            None if self.delay.is_zero() => {
                self.deadline = Some(now);
                cx.waker().wake_by_ref();
                std::task::Poll::Pending
            }
            None => {
                let at = now + self.delay;
                self.deadline = Some(at);
                timer::wake_at(at, cx.waker().clone());
                std::task::Poll::Pending
            }
        }
    }
}

/// The timer thread: wakes each registered waker at its deadline.
mod timer {
    use std::cmp::Reverse;
    use std::collections::BinaryHeap;
    use std::sync::mpsc::{channel, RecvTimeoutError, Sender};
    use std::sync::{Mutex, OnceLock};
    use std::task::Waker;
    use std::time::Instant;

    struct Due(Instant, Waker);

    impl PartialEq for Due {
        fn eq(&self, other: &Self) -> bool {
            self.0 == other.0
        }
    }
    impl Eq for Due {}
    impl PartialOrd for Due {
        fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
            Some(self.cmp(other))
        }
    }
    impl Ord for Due {
        fn cmp(&self, other: &Self) -> std::cmp::Ordering {
            self.0.cmp(&other.0)
        }
    }

    static TIMER: OnceLock<Mutex<Sender<Due>>> = OnceLock::new();

    /// Wakes `waker` at `at` (started on first use; a thread that cannot
    /// start wakes at once, so a wait ends early rather than never).
    pub(super) fn wake_at(at: Instant, waker: Waker) {
        let sender = TIMER.get_or_init(|| {
            let (tx, rx) = channel::<Due>();
            let spawned = std::thread::Builder::new()
                .name("uascale-timer".into())
                .spawn(move || {
                    let mut heap: BinaryHeap<Reverse<Due>> = BinaryHeap::new();
                    loop {
                        let now = Instant::now();
                        while heap.peek().is_some_and(|Reverse(d)| d.0 <= now) {
                            if let Some(Reverse(d)) = heap.pop() {
                                d.1.wake();
                            }
                        }
                        let next = match heap.peek() {
                            Some(Reverse(d)) => rx.recv_timeout(d.0.saturating_duration_since(now)),
                            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
                        };
                        match next {
                            Ok(due) => heap.push(Reverse(due)),
                            Err(RecvTimeoutError::Timeout) => {}
                            Err(RecvTimeoutError::Disconnected) => return,
                        }
                    }
                });
            if spawned.is_err() {
                tracing::warn!("timer thread did not start; timed waits end at once");
            }
            Mutex::new(tx)
        });
        let sent = sender
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .send(Due(at, waker));
        if let Err(e) = sent {
            e.0 .1.wake();
        }
    }
}
