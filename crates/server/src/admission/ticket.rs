//! Retry tickets: a refused client is given a slot time (its hint) and a
//! short opaque ticket; when it comes back around its slot with the
//! ticket, it is served ahead of clients without one
//! (docs/scalability.md, "Retry tickets").
//!
//! A ticket is 17 bytes, written as 34 hex digits: an 8-byte serial, the
//! stage it was issued by, and the first 8 bytes of a keyed MAC (P_SHA256,
//! the HMAC-SHA256 based PRF of the security policies, keyed with 32 random
//! bytes drawn when the process starts) over the serial, the stage and the
//! client's source address. So a ticket cannot be forged (no key), moved
//! to another host (the address is in the MAC) or replayed: the book keeps
//! every ticket it issued, with its slot, until the ticket expires, and
//! marks it used when it is honoured. The book is bounded
//! ([`TicketBook::capacity`]): when it is full the oldest ticket is
//! forgotten (it expires early), so a flood of refusals or of forged
//! tickets cannot grow it; a forged ticket is refused on its MAC before
//! any lookup.
//!
//! Plain data on a passed-in clock.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::address::AddressKey;

/// The bytes of a ticket.
pub const TICKET_LEN: usize = 17;

/// The most tickets a book holds by default (about 48 bytes each, 3 MB).
pub const DEFAULT_TICKET_CAPACITY: usize = 65_536;

/// How early before its slot a ticket is still honoured: this share of the
/// hint it came with, at least [`EARLY_MIN`].
pub const EARLY_SHARE: f64 = 0.25;

/// The least early tolerance.
pub const EARLY_MIN: Duration = Duration::from_millis(100);

/// How late after its slot a ticket is still honoured: the hint it came
/// with again, at least [`LATE_MIN`]; then it expires.
pub const LATE_MIN: Duration = Duration::from_secs(2);

/// The stage a ticket was issued by.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TicketStage {
    /// OpenSecureChannel handshakes.
    Handshake,
    /// Session establishment.
    Establishment,
}

impl TicketStage {
    fn byte(self) -> u8 {
        match self {
            TicketStage::Handshake => 1,
            TicketStage::Establishment => 2,
        }
    }
}

/// A retry ticket as it travels: opaque, [`TICKET_LEN`] bytes, written in
/// hex ([`fmt::Display`], [`Ticket::parse`]).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Ticket([u8; TICKET_LEN]);

impl Ticket {
    /// The ticket written as `text` (34 hex digits, either case); `None`
    /// for anything else.
    pub fn parse(text: &str) -> Option<Ticket> {
        let text = text.as_bytes();
        if text.len() != TICKET_LEN * 2 {
            return None;
        }
        let mut out = [0u8; TICKET_LEN];
        for (i, pair) in text.chunks_exact(2).enumerate() {
            let hi = hex_value(*pair.first()?)?;
            let lo = hex_value(*pair.get(1)?)?;
            *out.get_mut(i)? = hi << 4 | lo;
        }
        Some(Ticket(out))
    }

    fn serial(&self) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&self.0[..8]);
        u64::from_be_bytes(b)
    }

    fn stage_byte(&self) -> u8 {
        self.0[8]
    }
}

fn hex_value(c: u8) -> Option<u8> {
    match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        b'A'..=b'F' => Some(c - b'A' + 10),
        _ => None,
    }
}

impl fmt::Display for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for b in self.0 {
            write!(f, "{b:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Ticket({self})")
    }
}

/// What a ticket presented at a stage is worth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Presented {
    /// Back within the window around its slot: honoured (now used).
    Honoured,
    /// Back well before its slot: the slot moved `penalty` later, the
    /// ticket still valid (the client is told to come back then).
    Early {
        /// The time from now until its (moved) slot.
        wait: Duration,
    },
    /// Back after its window, or its ticket forgotten: expired (it counts
    /// as no ticket).
    Expired,
    /// Already honoured once: refused as a replay (counts as no ticket).
    Replayed,
    /// Not a ticket of this process, of this stage, or of this address
    /// (counts as no ticket).
    Forged,
}

#[derive(Debug, Clone)]
struct Issued {
    slot: Instant,
    /// Honoured from here.
    opens: Instant,
    /// Expired from here.
    closes: Instant,
    used: bool,
}

/// Counts of what happened to tickets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TicketCounts {
    /// Tickets issued.
    pub issued: u64,
    /// Tickets honoured (back within their window).
    pub honoured: u64,
    /// Tickets that expired unused (never back, back too late, or
    /// forgotten when the book was full).
    pub expired: u64,
    /// Tickets presented a second time.
    pub replayed: u64,
    /// Presented tickets that were not this process's.
    pub forged: u64,
    /// Tickets back too early (answered with a longer hint).
    pub early: u64,
}

/// The tickets issued and not yet expired, with their slots.
#[derive(Debug)]
pub struct TicketBook {
    key: [u8; 32],
    next_serial: u64,
    capacity: usize,
    issued: BTreeMap<u64, Issued>,
    /// Serials by when they close, oldest first (closing times are not in
    /// serial order: slots differ).
    closing: VecDeque<(Instant, u64)>,
    counts: TicketCounts,
    /// Expired unused since last asked ([`TicketBook::take_expired`]).
    expired_since: u64,
}

impl TicketBook {
    /// An empty book holding at most `capacity` tickets (at least 16), its
    /// MAC keyed with `key`.
    pub fn new(key: [u8; 32], capacity: usize) -> Self {
        TicketBook {
            key,
            next_serial: 1,
            capacity: capacity.max(16),
            issued: BTreeMap::new(),
            closing: VecDeque::new(),
            counts: TicketCounts::default(),
            expired_since: 0,
        }
    }

    /// An empty book with a random key (a fixed one when the system has
    /// no randomness: tickets then only order, they are still single-use).
    pub fn random(capacity: usize) -> Self {
        let mut key = [0u8; 32];
        if getrandom::getrandom(&mut key).is_err() {
            key = [0x5a; 32];
        }
        Self::new(key, capacity)
    }

    /// The most tickets held.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Tickets held now (issued and not expired, used or not).
    pub fn len(&self) -> usize {
        self.issued.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.issued.is_empty()
    }

    /// What happened to tickets so far.
    pub fn counts(&self) -> TicketCounts {
        self.counts
    }

    /// A presented ticket did not even parse: counted as forged.
    pub fn note_forged(&mut self) {
        self.counts.forged += 1;
    }

    /// The tickets that expired unused since the last call (what the
    /// schedules' return estimate learns from).
    pub fn take_expired(&mut self) -> u64 {
        std::mem::take(&mut self.expired_since)
    }

    fn mac(&self, serial: u64, stage: u8, peer: AddressKey) -> [u8; 8] {
        let mut seed = Vec::with_capacity(26);
        seed.extend_from_slice(&serial.to_be_bytes());
        seed.push(stage);
        match peer {
            AddressKey::V4(a) => {
                seed.push(4);
                seed.extend_from_slice(&a.to_be_bytes());
            }
            AddressKey::V6Prefix(p) => {
                seed.push(6);
                seed.extend_from_slice(&p.to_be_bytes());
            }
        }
        let mut out = [0u8; 8];
        uascale_crypto::policy::p_sha256(&self.key, &seed, &mut out);
        out
    }

    /// Forgets the tickets whose window closed by `now`.
    fn sweep(&mut self, now: Instant) {
        while let Some(&(closes, serial)) = self.closing.front() {
            if closes > now {
                break;
            }
            self.closing.pop_front();
            self.forget(serial, closes);
        }
    }

    fn forget(&mut self, serial: u64, closes: Instant) {
        // A moved slot left its old closing time behind: only the current
        // one forgets the ticket.
        if self.issued.get(&serial).is_some_and(|i| i.closes == closes) {
            if let Some(i) = self.issued.remove(&serial) {
                if !i.used {
                    self.counts.expired += 1;
                    self.expired_since += 1;
                }
            }
        }
    }

    fn push_closing(&mut self, closes: Instant, serial: u64) {
        // Mostly appended at the back; an earlier one is inserted in order.
        let at = self.closing.partition_point(|&(c, _)| c <= closes);
        self.closing.insert(at, (closes, serial));
        if self.closing.len() > self.capacity.saturating_mul(2) {
            // Stale entries of moved slots: rebuild from the book.
            let mut all: Vec<(Instant, u64)> =
                self.issued.iter().map(|(s, i)| (i.closes, *s)).collect();
            all.sort_unstable();
            self.closing = all.into();
        }
    }

    /// Issues a ticket at `now` by `stage` to `peer` for a slot at `slot`
    /// (the hint is `slot - now`).
    pub fn issue(
        &mut self,
        stage: TicketStage,
        peer: IpAddr,
        now: Instant,
        slot: Instant,
    ) -> Ticket {
        self.sweep(now);
        if self.issued.len() >= self.capacity {
            // Full: the oldest goes (it expires early).
            if let Some((&serial, i)) = self.issued.iter().next() {
                let closes = i.closes;
                self.forget(serial, closes);
            }
        }
        let serial = self.next_serial;
        self.next_serial += 1;
        let hint = slot.saturating_duration_since(now);
        let early = hint.mul_f64(EARLY_SHARE).max(EARLY_MIN);
        let late = hint.max(LATE_MIN);
        let issued = Issued {
            slot,
            opens: slot.checked_sub(early).unwrap_or(now).max(now),
            closes: slot + late,
            used: false,
        };
        self.push_closing(issued.closes, serial);
        self.issued.insert(serial, issued);
        self.counts.issued += 1;
        let mut t = [0u8; TICKET_LEN];
        t[..8].copy_from_slice(&serial.to_be_bytes());
        t[8] = stage.byte();
        t[9..].copy_from_slice(&self.mac(serial, stage.byte(), AddressKey::of(peer)));
        Ticket(t)
    }

    /// Whether `ticket` was made by this book for `stage` and `peer` (its
    /// MAC matches).
    fn genuine(&self, stage: TicketStage, ticket: &Ticket, peer: IpAddr) -> bool {
        let expected = self.mac(ticket.serial(), ticket.stage_byte(), AddressKey::of(peer));
        ticket.stage_byte() == stage.byte() && ticket.0[9..] == expected
    }

    /// Whether `ticket` would be honoured at `stage` from `peer` at `now`
    /// ([`TicketBook::present`] answering `Honoured`), without using it
    /// or counting anything: the Hello of a ticket holder passes to the
    /// OpenSecureChannel that presents it.
    pub fn would_honour(
        &self,
        stage: TicketStage,
        ticket: &Ticket,
        peer: IpAddr,
        now: Instant,
    ) -> bool {
        if !self.genuine(stage, ticket, peer) {
            return false;
        }
        self.issued
            .get(&ticket.serial())
            .is_some_and(|i| !i.used && i.opens <= now && now < i.closes)
    }

    /// `ticket` presented at `stage` by `peer` at `now`. A ticket back well
    /// before its slot keeps its place in the book, its slot moved later by
    /// as much as it came early (its own slot only: no other client's
    /// hint grows).
    pub fn present(
        &mut self,
        stage: TicketStage,
        ticket: &Ticket,
        peer: IpAddr,
        now: Instant,
    ) -> Presented {
        let serial = ticket.serial();
        if !self.genuine(stage, ticket, peer) {
            self.counts.forged += 1;
            return Presented::Forged;
        }
        self.sweep(now);
        let Some(i) = self.issued.get_mut(&serial) else {
            return Presented::Expired;
        };
        if i.used {
            self.counts.replayed += 1;
            return Presented::Replayed;
        }
        if now < i.opens {
            // Early: come back as late after the slot as it came before
            // it; the window moves with the slot.
            let early_by = i.slot.saturating_duration_since(now);
            let window_before = i.slot.saturating_duration_since(i.opens);
            let window_after = i.closes.saturating_duration_since(i.slot);
            i.slot += early_by;
            i.opens = i.slot.checked_sub(window_before).unwrap_or(i.slot);
            i.closes = i.slot + window_after;
            let (closes, wait) = (i.closes, i.slot.saturating_duration_since(now));
            self.counts.early += 1;
            self.push_closing(closes, serial);
            return Presented::Early { wait };
        }
        if now >= i.closes {
            let closes = i.closes;
            self.forget(serial, closes);
            return Presented::Expired;
        }
        i.used = true;
        self.counts.honoured += 1;
        Presented::Honoured
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    const H: TicketStage = TicketStage::Handshake;

    #[test]
    fn a_ticket_is_honoured_once_in_its_window() {
        let t0 = Instant::now();
        let mut book = TicketBook::new([7; 32], 1024);
        let a = ip("192.0.2.1");
        let t = book.issue(H, a, t0, t0 + ms(2000));
        let text = t.to_string();
        assert_eq!(text.len(), 34);
        let back = Ticket::parse(&text).unwrap();
        assert_eq!(back, t);
        // 25 % of the hint early is still in time.
        assert_eq!(
            book.present(H, &back, a, t0 + ms(1600)),
            Presented::Honoured
        );
        // Replayed: refused, however often.
        for _ in 0..3 {
            assert_eq!(
                book.present(H, &back, a, t0 + ms(2000)),
                Presented::Replayed
            );
        }
        let c = book.counts();
        assert_eq!((c.issued, c.honoured, c.replayed), (1, 1, 3));
    }

    #[test]
    fn forged_tickets_are_refused_on_their_mac() {
        let t0 = Instant::now();
        let mut book = TicketBook::new([7; 32], 1024);
        let a = ip("192.0.2.1");
        let t = book.issue(H, a, t0, t0 + ms(500));
        // Another host presenting it.
        assert_eq!(
            book.present(H, &t, ip("192.0.2.2"), t0 + ms(500)),
            Presented::Forged
        );
        // Another stage.
        assert_eq!(
            book.present(TicketStage::Establishment, &t, a, t0 + ms(500)),
            Presented::Forged
        );
        // A bit flipped anywhere.
        for i in 0..TICKET_LEN {
            let mut f = t;
            f.0[i] ^= 1;
            assert_eq!(
                book.present(H, &f, a, t0 + ms(500)),
                Presented::Forged,
                "{i}"
            );
        }
        // Another process's key.
        let mut other = TicketBook::new([8; 32], 1024);
        let o = other.issue(H, a, t0, t0 + ms(500));
        assert_eq!(book.present(H, &o, a, t0 + ms(500)), Presented::Forged);
        // Not a ticket at all.
        assert_eq!(Ticket::parse("zz"), None);
        assert_eq!(Ticket::parse(&"g".repeat(34)), None);
        assert_eq!(Ticket::parse(&"0".repeat(36)), None);
        // The genuine one still works.
        assert_eq!(book.present(H, &t, a, t0 + ms(500)), Presented::Honoured);
        assert_eq!(book.counts().forged, 2 + TICKET_LEN as u64 + 1);
    }

    #[test]
    fn tickets_expire_after_their_window() {
        let t0 = Instant::now();
        let mut book = TicketBook::new([1; 32], 1024);
        let a = ip("198.51.100.4");
        let t = book.issue(H, a, t0, t0 + ms(1000));
        // The window after the slot is the larger of the hint and 2 s.
        assert_eq!(book.present(H, &t, a, t0 + ms(3001)), Presented::Expired);
        let u = book.issue(H, a, t0, t0 + ms(1000));
        // Never presented: forgotten when its window closes.
        assert_eq!(book.len(), 1);
        book.issue(H, a, t0 + ms(5000), t0 + ms(6000));
        assert_eq!(book.len(), 1);
        assert_eq!(book.present(H, &u, a, t0 + ms(5000)), Presented::Expired);
        assert_eq!(book.counts().expired, 2);
        assert_eq!(book.take_expired(), 2);
        assert_eq!(book.take_expired(), 0);
    }

    #[test]
    fn an_early_return_moves_only_its_own_slot() {
        let t0 = Instant::now();
        let mut book = TicketBook::new([1; 32], 1024);
        let a = ip("198.51.100.4");
        let t = book.issue(H, a, t0, t0 + ms(4000));
        let other = book.issue(H, a, t0, t0 + ms(4000));
        // Back after 1 s of its 4: 3 s early, so its slot is 3 s later.
        let Presented::Early { wait } = book.present(H, &t, a, t0 + ms(1000)) else {
            panic!("early")
        };
        assert_eq!(wait, ms(6000));
        // Still early at the old slot; honoured at the new one.
        assert!(matches!(
            book.present(H, &t, a, t0 + ms(4000)),
            Presented::Early { .. }
        ));
        assert_eq!(
            book.present(H, &other, a, t0 + ms(4000)),
            Presented::Honoured
        );
        // (at 4 s it was 3 s early again: the slot is now at 10 s)
        assert_eq!(book.present(H, &t, a, t0 + ms(10_000)), Presented::Honoured);
        assert_eq!(book.counts().early, 2);
    }

    #[test]
    fn the_book_stays_bounded_under_a_flood() {
        let t0 = Instant::now();
        let mut book = TicketBook::new([3; 32], 1000);
        let a = ip("203.0.113.1");
        let first = book.issue(H, a, t0, t0 + Duration::from_secs(30));
        for i in 0..100_000u64 {
            let now = t0 + Duration::from_micros(i);
            book.issue(H, a, now, now + Duration::from_secs(30));
            assert!(book.len() <= 1000);
        }
        // The oldest were forgotten: they count as expired.
        assert_eq!(
            book.present(H, &first, a, t0 + Duration::from_secs(30)),
            Presented::Expired
        );
        assert!(book.closing.len() <= 2000);
        // A flood of forged tickets holds nothing.
        let before = book.len();
        for i in 0..10_000u64 {
            let mut t = [0u8; TICKET_LEN];
            t[..8].copy_from_slice(&i.to_be_bytes());
            t[8] = 1;
            assert_eq!(book.present(H, &Ticket(t), a, t0), Presented::Forged);
        }
        assert_eq!(book.len(), before);
    }
}
