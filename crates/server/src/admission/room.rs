//! A stage's waiting room: requests that wait for a place, ticket holders
//! first (in the order they came), then the rest (in the order they came).
//! Plain data; the gates hold it under their mutex and wake the wakers it
//! hands back once unlocked.

use std::collections::VecDeque;
use std::task::Waker;

#[derive(Debug)]
struct Waiter {
    id: u64,
    priority: bool,
    waker: Option<Waker>,
}

/// The waiters of one stage.
#[derive(Debug, Default)]
pub struct Room {
    waiting: VecDeque<Waiter>,
    /// Waiters given a place they have not collected yet.
    granted: Vec<u64>,
    next_id: u64,
}

impl Room {
    /// Waiters without a place.
    pub fn len(&self) -> usize {
        self.waiting.len()
    }

    /// Whether no one waits.
    pub fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Ticket holders waiting.
    pub fn priority_len(&self) -> usize {
        self.waiting.iter().take_while(|w| w.priority).count()
    }

    /// The waiters a newcomer would queue behind.
    pub fn ahead_of(&self, priority: bool) -> usize {
        if priority {
            self.priority_len()
        } else {
            self.len()
        }
    }

    /// A new waiter (behind the other ticket holders when `priority`,
    /// else last); its id.
    pub fn push(&mut self, priority: bool) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        let w = Waiter {
            id,
            priority,
            waker: None,
        };
        if priority {
            let at = self.priority_len();
            self.waiting.insert(at, w);
        } else {
            self.waiting.push_back(w);
        }
        id
    }

    /// Hands a place to the first waiter, if any: its waker (to wake once
    /// unlocked; `None` when it was never polled).
    pub fn grant_next(&mut self) -> Option<Option<Waker>> {
        let w = self.waiting.pop_front()?;
        self.granted.push(w.id);
        Some(w.waker)
    }

    /// Polls waiter `id`: true (and forgotten) when it was granted a place;
    /// else its waker is kept.
    pub fn poll(&mut self, id: u64, waker: &Waker) -> bool {
        if let Some(i) = self.granted.iter().position(|g| *g == id) {
            self.granted.swap_remove(i);
            return true;
        }
        if let Some(w) = self.waiting.iter_mut().find(|w| w.id == id) {
            match &mut w.waker {
                Some(old) if old.will_wake(waker) => {}
                slot => *slot = Some(waker.clone()),
            }
        }
        false
    }

    /// Waiter `id` leaves: true when it had been granted a place (which the
    /// caller frees).
    pub fn leave(&mut self, id: u64) -> bool {
        if let Some(i) = self.granted.iter().position(|g| *g == id) {
            self.granted.swap_remove(i);
            return true;
        }
        self.waiting.retain(|w| w.id != id);
        false
    }
}

/// Wakes `wakers` (after the lock is released).
pub fn wake_all(wakers: Vec<Option<Waker>>) {
    for w in wakers.into_iter().flatten() {
        w.wake();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticket_holders_go_first_in_their_order() {
        let mut r = Room::default();
        let a = r.push(false);
        let b = r.push(true);
        let c = r.push(false);
        let d = r.push(true);
        assert_eq!(r.ahead_of(true), 2);
        assert_eq!(r.ahead_of(false), 4);
        let w = std::task::Waker::noop();
        let mut order = Vec::new();
        while r.grant_next().is_some() {}
        for id in [a, b, c, d] {
            if r.poll(id, w) {
                order.push(id);
            }
        }
        assert_eq!(order.len(), 4);
        assert_eq!(r.granted.len(), 0);
        let mut r = Room::default();
        let a = r.push(false);
        let b = r.push(true);
        r.grant_next();
        assert!(r.poll(b, w));
        assert!(!r.poll(a, w));
        assert!(!r.leave(a));
        assert!(r.is_empty());
    }
}
