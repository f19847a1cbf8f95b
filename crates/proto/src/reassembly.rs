//! Reassembly of chunked messages (Part 6 §6.7.2) under a shared budget
//! (docs/scalability.md §2, "incomplete-message capacity").
//!
//! One [`ReassemblyBudget`] is shared by every connection of a server and
//! bounds the bytes retained for messages whose final chunk has not arrived.
//! Channels without an activated session may use only a share of it, so a
//! flood of half-sent messages from unauthenticated peers cannot starve the
//! sessions already working. A message whose chunks stop arriving is
//! released at a fixed deadline. Single-chunk messages, the common case,
//! never touch the budget.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use uascale_types::StatusCode;

use crate::error::ChannelError;
use crate::tcp::ChunkType;

/// Bytes of incomplete messages retained across all connections.
#[derive(Debug)]
pub struct ReassemblyBudget {
    total: usize,
    unactivated_max: usize,
    used: AtomicUsize,
    used_unactivated: AtomicUsize,
}

impl ReassemblyBudget {
    /// A budget of `total` bytes of which channels without an activated
    /// session may hold at most `unactivated_percent` %.
    pub fn new(total: usize, unactivated_percent: u8) -> Arc<Self> {
        let pct = usize::from(unactivated_percent.min(100));
        Arc::new(ReassemblyBudget {
            total,
            unactivated_max: total / 100 * pct + total % 100 * pct / 100,
            used: AtomicUsize::new(0),
            used_unactivated: AtomicUsize::new(0),
        })
    }

    /// Bytes retained now.
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Bytes retained now by channels without an activated session.
    pub fn used_unactivated(&self) -> usize {
        self.used_unactivated.load(Ordering::Relaxed)
    }

    fn add(counter: &AtomicUsize, bytes: usize, max: usize) -> bool {
        counter
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |u| {
                u.checked_add(bytes).filter(|n| *n <= max)
            })
            .is_ok()
    }

    fn try_take(&self, bytes: usize, activated: bool) -> bool {
        if !activated && !Self::add(&self.used_unactivated, bytes, self.unactivated_max) {
            return false;
        }
        if Self::add(&self.used, bytes, self.total) {
            return true;
        }
        if !activated {
            self.used_unactivated.fetch_sub(bytes, Ordering::AcqRel);
        }
        false
    }

    fn give_back(&self, bytes: usize, activated: bool) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
        if !activated {
            self.used_unactivated.fetch_sub(bytes, Ordering::AcqRel);
        }
    }

    /// Reserves `bytes`; `None` when the budget (or the unactivated share)
    /// would be exceeded. The bytes return when the reservation drops.
    pub fn try_reserve(self: &Arc<Self>, bytes: usize, activated: bool) -> Option<Reservation> {
        self.try_take(bytes, activated).then(|| Reservation {
            budget: Arc::clone(self),
            bytes,
            activated,
        })
    }
}

/// Bytes held from a [`ReassemblyBudget`] until dropped.
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<ReassemblyBudget>,
    bytes: usize,
    activated: bool,
}

impl Reservation {
    /// Grows the reservation by `extra` bytes; false (unchanged) when the
    /// budget cannot give them.
    pub fn grow(&mut self, extra: usize) -> bool {
        if self.budget.try_take(extra, self.activated) {
            self.bytes += extra;
            true
        } else {
            false
        }
    }

    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.give_back(self.bytes, self.activated);
    }
}

/// Per-channel bounds on reassembly.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AssemblyLimits {
    /// Largest message body; `None` = no limit but the budget.
    pub max_message_size: Option<usize>,
    /// Most chunks per message; `None` = no limit but the budget.
    pub max_chunk_count: Option<u32>,
    /// Messages being reassembled at once on one channel. Default 4.
    pub max_in_progress: usize,
    /// Time allowed between two chunks of one message: a message whose
    /// next chunk does not come in time is released. Default 10 s.
    pub deadline: Duration,
}

impl Default for AssemblyLimits {
    fn default() -> Self {
        AssemblyLimits {
            max_message_size: Some(16 << 20),
            max_chunk_count: Some(4096),
            max_in_progress: 4,
            deadline: Duration::from_secs(10),
        }
    }
}

#[derive(Debug)]
struct Partial {
    request_id: u32,
    body: Vec<u8>,
    chunks: u32,
    expires: Instant,
    _reservation: Reservation,
}

/// What one chunk did.
#[derive(Debug, PartialEq, Eq)]
pub enum Assembled {
    /// More chunks are needed.
    Incomplete,
    /// The message is whole.
    Complete {
        /// Its request id.
        request_id: u32,
        /// The body of every chunk, in order.
        body: Vec<u8>,
    },
    /// The sender aborted it (chunk type `A`).
    Aborted {
        /// Its request id.
        request_id: u32,
    },
}

/// Reassembles the chunked messages of one channel.
#[derive(Debug)]
pub struct Assembler {
    limits: Limits,
    budget: Arc<ReassemblyBudget>,
    partials: Vec<Partial>,
    expired: u64,
}

/// [`AssemblyLimits`] as one channel keeps them: 16 bytes instead of 48,
/// because every connection's task carries them (tokio allocates a task in
/// steps of 128 bytes, and these 32 bytes keep the connection's task a step
/// smaller). Sizes and counts are `u32` (a UA-TCP message size is one; a
/// larger configured limit is no limit), the deadline is in milliseconds
/// (longer ones are cut to about 49 days).
#[derive(Debug, Clone, Copy)]
struct Limits {
    /// Largest message body; `u32::MAX` = no limit but the budget.
    max_message_size: u32,
    /// Most chunks per message; `u32::MAX` = no limit but the budget.
    max_chunk_count: u32,
    max_in_progress: u32,
    deadline_ms: u32,
}

impl From<AssemblyLimits> for Limits {
    fn from(l: AssemblyLimits) -> Self {
        let cut = |v: usize| u32::try_from(v).unwrap_or(u32::MAX);
        Limits {
            max_message_size: l.max_message_size.map_or(u32::MAX, cut),
            max_chunk_count: l.max_chunk_count.unwrap_or(u32::MAX),
            max_in_progress: cut(l.max_in_progress),
            deadline_ms: u32::try_from(l.deadline.as_millis()).unwrap_or(u32::MAX),
        }
    }
}

impl Limits {
    fn deadline(&self) -> Duration {
        Duration::from_millis(u64::from(self.deadline_ms))
    }
}

fn too_large(what: &'static str) -> ChannelError {
    ChannelError::Peer {
        status: StatusCode::BadRequestTooLarge,
        what,
    }
}

impl Assembler {
    /// An assembler drawing on `budget`.
    pub fn new(limits: AssemblyLimits, budget: Arc<ReassemblyBudget>) -> Self {
        Assembler {
            limits: limits.into(),
            budget,
            partials: Vec::new(),
            expired: 0,
        }
    }

    /// Replaces the limits (after HEL/ACK negotiation).
    pub fn set_limits(&mut self, limits: AssemblyLimits) {
        self.limits = limits.into();
    }

    /// Feeds the decrypted body of one chunk. `activated` says whether the
    /// channel has an activated session (it decides the budget share). On an
    /// error the message is dropped; the caller closes the channel with the
    /// error's status.
    pub fn push(
        &mut self,
        now: Instant,
        request_id: u32,
        chunk_type: ChunkType,
        part: &[u8],
        activated: bool,
    ) -> Result<Assembled, ChannelError> {
        let idx = self
            .partials
            .iter()
            .position(|p| p.request_id == request_id);
        match (chunk_type, idx) {
            (ChunkType::Abort, Some(i)) => {
                self.partials.swap_remove(i);
                Ok(Assembled::Aborted { request_id })
            }
            (ChunkType::Abort, None) => Ok(Assembled::Aborted { request_id }),
            (ChunkType::Final, None) => {
                self.check_size(part.len(), 1)?;
                Ok(Assembled::Complete {
                    request_id,
                    body: part.to_vec(),
                })
            }
            (ChunkType::Final, Some(i)) => {
                let mut p = self.partials.swap_remove(i);
                self.check_size(p.body.len() + part.len(), p.chunks + 1)?;
                p.body.extend_from_slice(part);
                Ok(Assembled::Complete {
                    request_id,
                    body: std::mem::take(&mut p.body),
                })
            }
            (ChunkType::Intermediate, None) => {
                self.check_size(part.len(), 1)?;
                if self.partials.len() >= self.limits.max_in_progress as usize {
                    return Err(ChannelError::Peer {
                        status: StatusCode::BadTcpMessageTooLarge,
                        what: "too many chunked messages in progress on one channel",
                    });
                }
                let reservation = self.budget.try_reserve(part.len(), activated).ok_or(
                    ChannelError::Resource {
                        status: StatusCode::BadTcpMessageTooLarge,
                        what: "incomplete-message budget exhausted",
                    },
                )?;
                self.partials.push(Partial {
                    request_id,
                    body: part.to_vec(),
                    chunks: 1,
                    expires: now + self.limits.deadline(),
                    _reservation: reservation,
                });
                Ok(Assembled::Incomplete)
            }
            (ChunkType::Intermediate, Some(i)) => {
                let (len, chunks) = (self.partials[i].body.len(), self.partials[i].chunks);
                if let Err(e) = self.check_size(len + part.len(), chunks + 1) {
                    self.partials.swap_remove(i);
                    return Err(e);
                }
                let p = &mut self.partials[i];
                if !p._reservation.grow(part.len()) {
                    self.partials.swap_remove(i);
                    return Err(ChannelError::Resource {
                        status: StatusCode::BadTcpMessageTooLarge,
                        what: "incomplete-message budget exhausted",
                    });
                }
                p.body.extend_from_slice(part);
                p.chunks += 1;
                // The deadline counts from the last chunk (progress, not
                // age): a large request on a slow link still arrives.
                p.expires = now + self.limits.deadline();
                Ok(Assembled::Incomplete)
            }
        }
    }

    fn check_size(&self, len: usize, chunks: u32) -> Result<(), ChannelError> {
        if len > self.limits.max_message_size as usize {
            return Err(too_large(
                "message larger than the negotiated MaxMessageSize",
            ));
        }
        if chunks > self.limits.max_chunk_count {
            return Err(too_large("more chunks than the negotiated MaxChunkCount"));
        }
        Ok(())
    }

    /// When the earliest incomplete message expires.
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.partials.iter().map(|p| p.expires).min()
    }

    /// Releases every message past its deadline; returns their request ids.
    pub fn handle_timeout(&mut self, now: Instant) -> Vec<u32> {
        let mut gone = Vec::new();
        self.partials.retain(|p| {
            if p.expires <= now {
                gone.push(p.request_id);
                false
            } else {
                true
            }
        });
        self.expired += gone.len() as u64;
        gone
    }

    /// Messages released at their deadline so far.
    pub fn expired_count(&self) -> u64 {
        self.expired
    }

    /// Messages being reassembled now.
    pub fn in_progress(&self) -> usize {
        self.partials.len()
    }
}

#[cfg(test)]
// Tests take one real instant as the origin of their simulated time.
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;

    fn asm(budget: &Arc<ReassemblyBudget>) -> Assembler {
        Assembler::new(AssemblyLimits::default(), Arc::clone(budget))
    }

    #[test]
    fn single_chunk_needs_no_budget() {
        let b = ReassemblyBudget::new(0, 50);
        let mut a = asm(&b);
        let r = a
            .push(Instant::now(), 1, ChunkType::Final, b"abc", false)
            .unwrap();
        assert_eq!(
            r,
            Assembled::Complete {
                request_id: 1,
                body: b"abc".to_vec()
            }
        );
    }

    #[test]
    fn chunks_concatenate_and_release_the_budget() {
        let b = ReassemblyBudget::new(1000, 50);
        let mut a = asm(&b);
        let t = Instant::now();
        assert_eq!(
            a.push(t, 7, ChunkType::Intermediate, b"he", true).unwrap(),
            Assembled::Incomplete
        );
        assert_eq!(
            a.push(t, 7, ChunkType::Intermediate, b"ll", true).unwrap(),
            Assembled::Incomplete
        );
        assert_eq!(b.used(), 4);
        let r = a.push(t, 7, ChunkType::Final, b"o", true).unwrap();
        assert_eq!(
            r,
            Assembled::Complete {
                request_id: 7,
                body: b"hello".to_vec()
            }
        );
        assert_eq!(b.used(), 0);
    }

    #[test]
    fn unactivated_channels_get_only_their_share() {
        let b = ReassemblyBudget::new(100, 30);
        let mut anon = asm(&b);
        let mut session = asm(&b);
        let t = Instant::now();
        anon.push(t, 1, ChunkType::Intermediate, &[0; 30], false)
            .unwrap();
        let e = anon
            .push(t, 2, ChunkType::Intermediate, &[0; 1], false)
            .unwrap_err();
        assert_eq!(e.status_code(), StatusCode::BadTcpMessageTooLarge);
        // Headroom stays for the activated session.
        session
            .push(t, 1, ChunkType::Intermediate, &[0; 70], true)
            .unwrap();
        assert_eq!(b.used(), 100);
        assert!(session
            .push(t, 1, ChunkType::Intermediate, &[0; 1], true)
            .is_err());
        drop(anon);
        assert_eq!(b.used_unactivated(), 0);
        assert_eq!(b.used(), 0, "failed grow dropped the session's partial too");
    }

    #[test]
    fn deadline_releases_stalled_messages() {
        let b = ReassemblyBudget::new(1000, 50);
        let mut a = asm(&b);
        let t = Instant::now();
        a.push(t, 3, ChunkType::Intermediate, b"x", false).unwrap();
        assert_eq!(a.poll_timeout(), Some(t + Duration::from_secs(10)));
        assert!(a.handle_timeout(t + Duration::from_secs(9)).is_empty());
        assert_eq!(a.handle_timeout(t + Duration::from_secs(10)), vec![3]);
        assert_eq!(b.used(), 0);
        assert_eq!(a.expired_count(), 1);
        assert_eq!(a.poll_timeout(), None);
    }

    /// A hostile-input finding: the deadline counts from the last chunk, so a
    /// slow message that keeps arriving is not released.
    #[test]
    fn the_deadline_counts_from_the_last_chunk() {
        let b = ReassemblyBudget::new(1000, 50);
        let mut a = asm(&b);
        let t = Instant::now();
        let s = |n| t + Duration::from_secs(n);
        a.push(t, 3, ChunkType::Intermediate, b"x", false).unwrap();
        a.push(s(8), 3, ChunkType::Intermediate, b"y", false)
            .unwrap();
        assert_eq!(a.poll_timeout(), Some(s(18)));
        assert!(a.handle_timeout(s(12)).is_empty(), "still in progress");
        assert_eq!(
            a.push(s(16), 3, ChunkType::Final, b"z", false).unwrap(),
            Assembled::Complete {
                request_id: 3,
                body: b"xyz".to_vec()
            }
        );
    }

    #[test]
    fn size_count_and_in_progress_limits() {
        let b = ReassemblyBudget::new(1 << 20, 100);
        let limits = AssemblyLimits {
            max_message_size: Some(10),
            max_chunk_count: Some(3),
            max_in_progress: 2,
            ..AssemblyLimits::default()
        };
        let mut a = Assembler::new(limits, Arc::clone(&b));
        let t = Instant::now();
        assert_eq!(
            a.push(t, 1, ChunkType::Final, &[0; 11], true)
                .unwrap_err()
                .status_code(),
            StatusCode::BadRequestTooLarge
        );
        for _ in 0..3 {
            a.push(t, 2, ChunkType::Intermediate, &[0; 1], true)
                .unwrap();
        }
        assert_eq!(
            a.push(t, 2, ChunkType::Final, &[0; 1], true)
                .unwrap_err()
                .status_code(),
            StatusCode::BadRequestTooLarge
        );
        a.push(t, 3, ChunkType::Intermediate, &[0; 1], true)
            .unwrap();
        a.push(t, 4, ChunkType::Intermediate, &[0; 1], true)
            .unwrap();
        assert!(a
            .push(t, 5, ChunkType::Intermediate, &[0; 1], true)
            .is_err());
        assert_eq!(
            a.push(t, 3, ChunkType::Abort, &[], true).unwrap(),
            Assembled::Aborted { request_id: 3 }
        );
        assert_eq!(a.in_progress(), 1);
    }

    /// The compact limits a channel keeps read as the configured ones: a
    /// message of exactly the limit passes and one byte more does not; no
    /// limit, or one beyond what a u32 holds, is none; a deadline too long
    /// for milliseconds in a u32 is cut, not wrapped.
    #[test]
    fn kept_limits_read_as_configured() {
        let b = ReassemblyBudget::new(1 << 20, 100);
        let t = Instant::now();
        let exact = AssemblyLimits {
            max_message_size: Some(10),
            ..AssemblyLimits::default()
        };
        let mut a = Assembler::new(exact, Arc::clone(&b));
        assert!(a.push(t, 1, ChunkType::Final, &[0; 10], true).is_ok());
        assert!(a.push(t, 2, ChunkType::Final, &[0; 11], true).is_err());
        for unlimited in [None, Some(usize::MAX), Some(u32::MAX as usize + 1)] {
            let l = Limits::from(AssemblyLimits {
                max_message_size: unlimited,
                max_chunk_count: None,
                ..AssemblyLimits::default()
            });
            assert_eq!(
                (l.max_message_size, l.max_chunk_count),
                (u32::MAX, u32::MAX)
            );
        }
        let l = Limits::from(AssemblyLimits {
            deadline: Duration::from_secs(100 * 24 * 3600),
            ..AssemblyLimits::default()
        });
        assert_eq!(l.deadline(), Duration::from_millis(u64::from(u32::MAX)));
        let l = Limits::from(AssemblyLimits::default());
        assert_eq!(l.deadline(), AssemblyLimits::default().deadline);
        assert_eq!(l.max_in_progress, 4);
        assert_eq!(l.max_message_size, 16 << 20);
        assert_eq!(l.max_chunk_count, 4096);
    }
}
