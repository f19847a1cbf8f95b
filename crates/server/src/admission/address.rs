//! Per-source-address state: the connection token buckets, in a table
//! bounded in memory, and the count of handshakes in flight per address.
//!
//! A source address is an IPv4 address, or an IPv6 /64 (one host or site
//! usually holds a whole /64, so single IPv6 addresses would be free to
//! change); an IPv4-mapped IPv6 address (`::ffff:a.b.c.d`, what a dual-stack
//! listener sees) is its IPv4 address.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use super::bucket::TokenBucket;
use super::hint::{DecayingCount, RATE_TIME_CONSTANT};

/// A source address as admission counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum AddressKey {
    /// An IPv4 address (also from an IPv4-mapped IPv6 address).
    V4(u32),
    /// The top 64 bits of an IPv6 address.
    V6Prefix(u64),
}

impl AddressKey {
    /// The key of `ip`.
    pub fn of(ip: IpAddr) -> Self {
        match ip {
            IpAddr::V4(v4) => AddressKey::V4(u32::from(v4)),
            IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
                Some(v4) => AddressKey::V4(u32::from(v4)),
                None => AddressKey::V6Prefix((u128::from(v6) >> 64) as u64),
            },
        }
    }
}

/// The most addresses [`AddressBuckets`] keeps by default: 4,096 entries of
/// about 80 bytes, whatever the number of addresses seen.
pub const DEFAULT_ADDRESS_TABLE_CAPACITY: usize = 4096;

#[derive(Debug)]
struct Entry {
    bucket: TokenBucket,
    /// Refusals, fading: the demand that will come back.
    refused: DecayingCount,
    last_used: Instant,
}

/// What the per-address bucket said.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum AddressVerdict {
    /// A token was taken.
    Admit,
    /// No token: the time until the next one, and the refused demand from
    /// this address (the refusals of the last few seconds, fading, this
    /// one included).
    Refuse {
        /// Until the address's next token.
        wait: Duration,
        /// The fading count of its refusals.
        refused: f64,
    },
}

/// Token buckets per source address, at most `capacity` of them.
///
/// When the table is full and a new address arrives, one sweep makes room
/// for the next eighth of the capacity at once (so the sweep's cost is
/// spread over many arrivals): first the entries whose bucket is full again
/// go - forgetting them changes nothing, a new bucket starts full - then, if
/// that was not enough, the least recently used. A flood of spoofed or
/// distinct addresses therefore cannot grow the table; the most it can do is
/// push out the buckets of addresses that have been quiet the longest
/// (whose next connection then finds a full bucket; the global bucket still
/// bounds).
#[derive(Debug)]
pub struct AddressBuckets {
    rate_per_s: u32,
    burst: u32,
    capacity: usize,
    entries: HashMap<AddressKey, Entry>,
}

impl AddressBuckets {
    /// Buckets of `rate_per_s` and `burst` per address, at most `capacity`
    /// addresses (at least 8).
    pub fn new(rate_per_s: u32, burst: u32, capacity: usize) -> Self {
        AddressBuckets {
            rate_per_s,
            burst,
            capacity: capacity.max(8),
            entries: HashMap::new(),
        }
    }

    /// The per-address refill rate, tokens a second.
    pub fn rate_per_s(&self) -> u32 {
        self.rate_per_s
    }

    /// Addresses held now.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether none is held.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The most addresses held.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Takes a token from `ip`'s bucket at `now`.
    pub fn try_take(&mut self, ip: IpAddr, now: Instant) -> AddressVerdict {
        let key = AddressKey::of(ip);
        if !self.entries.contains_key(&key) && self.entries.len() >= self.capacity {
            self.make_room(now);
        }
        let entry = self.entries.entry(key).or_insert_with(|| Entry {
            bucket: TokenBucket::new(self.rate_per_s, self.burst),
            refused: DecayingCount::new(RATE_TIME_CONSTANT),
            last_used: now,
        });
        entry.last_used = entry.last_used.max(now);
        match entry.bucket.try_take(now) {
            Ok(()) => AddressVerdict::Admit,
            Err(wait) => {
                entry.refused.add(now, 1.0);
                AddressVerdict::Refuse {
                    wait,
                    refused: entry.refused.value(now),
                }
            }
        }
    }

    /// Gives back the token `ip` took at the same moment (a later stage
    /// refused the connection).
    pub fn give_back(&mut self, ip: IpAddr) {
        if let Some(e) = self.entries.get_mut(&AddressKey::of(ip)) {
            e.bucket.give_back();
        }
    }

    fn make_room(&mut self, now: Instant) {
        let target = self.capacity - self.capacity / 8;
        self.entries.retain(|_, e| !e.bucket.is_full(now));
        if self.entries.len() > target {
            let mut by_age: Vec<(Instant, AddressKey)> = self
                .entries
                .iter()
                .map(|(k, e)| (e.last_used, *k))
                .collect();
            let excess = self.entries.len() - target;
            by_age.select_nth_unstable(excess - 1);
            for (_, key) in &by_age[..excess] {
                self.entries.remove(key);
            }
        }
    }
}

/// How many of something (handshakes in flight) each source address has.
/// An address is held only while its count is above 0, so the table is
/// never larger than the total count - which the caller bounds.
#[derive(Debug, Default)]
pub struct PerAddressCount {
    counts: HashMap<AddressKey, u32>,
}

impl PerAddressCount {
    /// An empty count.
    pub fn new() -> Self {
        Self::default()
    }

    /// The count of `key`.
    pub fn get(&self, key: AddressKey) -> u32 {
        self.counts.get(&key).copied().unwrap_or(0)
    }

    /// Adds one to `key`'s count when it is below `limit`; false (and
    /// nothing changed) when it is not.
    pub fn try_add(&mut self, key: AddressKey, limit: u32) -> bool {
        let n = self.counts.entry(key).or_insert(0);
        if *n >= limit {
            if *n == 0 {
                self.counts.remove(&key);
            }
            return false;
        }
        *n += 1;
        true
    }

    /// Takes one from `key`'s count (nothing when it is 0).
    pub fn remove(&mut self, key: AddressKey) {
        if let Some(n) = self.counts.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                self.counts.remove(&key);
            }
        }
    }

    /// Addresses with a count above 0.
    pub fn addresses(&self) -> usize {
        self.counts.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    #[test]
    fn keys_are_ipv4_addresses_and_ipv6_prefixes() {
        let v4: IpAddr = "192.0.2.7".parse().unwrap();
        let mapped: IpAddr = "::ffff:192.0.2.7".parse().unwrap();
        assert_eq!(AddressKey::of(v4), AddressKey::of(mapped));
        assert_eq!(
            AddressKey::of(v4),
            AddressKey::V4(u32::from(Ipv4Addr::new(192, 0, 2, 7)))
        );
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff:ffff:ffff:ffff".parse().unwrap();
        let c: IpAddr = "2001:db8:1:3::1".parse().unwrap();
        assert_eq!(AddressKey::of(a), AddressKey::of(b));
        assert_ne!(AddressKey::of(a), AddressKey::of(c));
        assert_eq!(
            AddressKey::of(IpAddr::V6(Ipv6Addr::LOCALHOST)),
            AddressKey::V6Prefix(0)
        );
    }

    #[test]
    fn one_address_is_limited_and_others_are_not() {
        let t0 = Instant::now();
        let mut t = AddressBuckets::new(2, 3, 64);
        let a: IpAddr = "198.51.100.1".parse().unwrap();
        let b: IpAddr = "198.51.100.2".parse().unwrap();
        for _ in 0..3 {
            assert_eq!(t.try_take(a, t0), AddressVerdict::Admit);
        }
        let AddressVerdict::Refuse { wait, refused } = t.try_take(a, t0) else {
            panic!("a fourth connection at once is refused");
        };
        assert_eq!(wait, Duration::from_millis(500));
        assert!((refused - 1.0).abs() < 1e-9);
        let AddressVerdict::Refuse { refused, .. } = t.try_take(a, t0) else {
            panic!()
        };
        assert!((refused - 2.0).abs() < 1e-9);
        assert_eq!(t.try_take(b, t0), AddressVerdict::Admit);
        // The bucket refills at 2 a second.
        assert_eq!(
            t.try_take(a, t0 + Duration::from_millis(500)),
            AddressVerdict::Admit
        );
        // A given-back token is there again.
        t.give_back(a);
        assert_eq!(
            t.try_take(a, t0 + Duration::from_millis(500)),
            AddressVerdict::Admit
        );
    }

    #[test]
    fn the_table_stays_bounded_under_a_flood_of_addresses() {
        let t0 = Instant::now();
        let mut table = AddressBuckets::new(1, 4, DEFAULT_ADDRESS_TABLE_CAPACITY);
        let hot: IpAddr = "203.0.113.9".parse().unwrap();
        for _ in 0..4 {
            assert_eq!(table.try_take(hot, t0), AddressVerdict::Admit);
        }
        // 100,000 distinct addresses within one second (each takes one
        // token, so no bucket of theirs is full again while the flood
        // lasts: the sweeps must drop the least recently used); the hot
        // address keeps connecting and keeps being refused.
        let mut refused_hot = 0;
        for i in 0..100_000u32 {
            let now = t0 + Duration::from_micros(u64::from(i) * 10);
            let ip = IpAddr::V4(Ipv4Addr::from(0x0A00_0000 + i));
            assert_eq!(table.try_take(ip, now), AddressVerdict::Admit);
            assert!(table.len() <= DEFAULT_ADDRESS_TABLE_CAPACITY);
            if i % 1000 == 0 && table.try_take(hot, now) != AddressVerdict::Admit {
                refused_hot += 1;
            }
        }
        assert!(table.len() <= DEFAULT_ADDRESS_TABLE_CAPACITY);
        // Recently used, the hot address kept its empty bucket: the flood
        // did not reset it (one token came back in the second).
        assert!(refused_hot >= 98, "{refused_hot}");

        // Later, when every bucket is full again, the sweep drops those
        // first and the table does not go beyond its bound either.
        let later = t0 + Duration::from_secs(60);
        for i in 0..10_000u32 {
            let ip = IpAddr::V6(Ipv6Addr::from(
                (0x2001_0db8_u128 << 96) | (u128::from(i) << 64),
            ));
            assert_eq!(table.try_take(ip, later), AddressVerdict::Admit);
        }
        assert!(table.len() <= DEFAULT_ADDRESS_TABLE_CAPACITY);
    }

    #[test]
    fn per_address_counts_hold_only_addresses_in_use() {
        let mut c = PerAddressCount::new();
        let a = AddressKey::V4(1);
        assert!(c.try_add(a, 2));
        assert!(c.try_add(a, 2));
        assert!(!c.try_add(a, 2));
        assert_eq!(c.get(a), 2);
        assert!(!c.try_add(AddressKey::V4(2), 0));
        assert_eq!(c.addresses(), 1);
        c.remove(a);
        c.remove(a);
        c.remove(a);
        assert_eq!(c.get(a), 0);
        assert_eq!(c.addresses(), 0);
    }
}
