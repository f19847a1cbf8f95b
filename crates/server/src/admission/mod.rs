//! Admission control (docs/scalability.md §2): decisions taken **before** the
//! work they protect, each refusal a fast busy answer with a retry-after
//! hint.
//!
//! Every stage is plain data on a passed-in clock (`Instant` arguments, no
//! clock read, no runtime), so each is unit-tested on a simulated clock:
//!
//! - [`bucket`]: the token bucket of the connection rate;
//! - [`address`]: per-source-address buckets (IPv4 address, IPv6 /64) in a
//!   table bounded in memory, and per-address counts;
//! - [`gate`]: the OpenSecureChannel handshakes in flight
//!   ([`HandshakeGate`]) and session establishment ([`EstablishmentGate`],
//!   with its waiting room);
//! - [`channels`]: the `max_channel_count` policy ([`ChannelCount`]);
//! - [`hint`]: the retry-after hint (backlog over measured completion rate,
//!   clamped, jittered) and the [`Refusal`] that carries it;
//! - [`service_level`]: the load-based `Server.ServiceLevel`;
//! - [`host`]: the CPUs the process may use and the open-files limit.
//!
//! [`Admission`] composes them from the `[admission]` configuration. What
//! the network layer calls: [`Admission::on_accept`] for each accepted TCP
//! connection, before the sans-IO connection is created
//! ([`uascale_proto::PendingConnection::accept`] or `refuse`);
//! [`Admission::connection_closed`] when one closes;
//! [`Admission::channel_decision`] when a channel opens;
//! [`Admission::handshakes`] around the asymmetric work of
//! OpenSecureChannel; and the services: [`Admission::establishment`] around
//! CreateSession (the session-count check of
//! [`crate::session::SessionTable::reserve`] stays where it is).
//!
//! Status: built and tested here, not yet wired into the network layer and
//! the services (`ServerState` holds [`Admission::disabled`]).

use std::net::SocketAddr;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use uascale_types::StatusCode;

use crate::config::ServerConfig;

pub mod address;
pub mod bucket;
pub mod channels;
pub mod gate;
pub mod hint;
pub mod host;
pub mod service_level;

pub use channels::{ChannelCount, ChannelDecision};
pub use gate::{EstablishmentGate, EstablishmentGuard, HandshakeGate, HandshakeGuard};
pub use hint::Refusal;
pub use service_level::ServiceLevel;

use address::{AddressBuckets, AddressVerdict, DEFAULT_ADDRESS_TABLE_CAPACITY};
use bucket::TokenBucket;
use hint::{CompletionRate, DecayingCount, Jitter, RATE_TIME_CONSTANT};

/// The retry-after hint of `BadTooManySessions` (the server holds
/// `max_session_count` sessions): sessions end at no rate the server can
/// measure ahead, so a fixed second, as the hint's fallback.
pub const SESSION_FULL_RETRY_AFTER: Duration = hint::HINT_FALLBACK;

/// What to do with a new connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// Take it into work.
    Admit,
    /// Answer ERR `status` with `RetryAfterMs=<retry_after>` in the reason
    /// and close, without parsing more than the Hello.
    Refuse {
        /// The ERR's status (`BadTcpServerTooBusy`).
        status: StatusCode,
        /// The hint.
        retry_after: Duration,
        /// Which check refused it (for the metrics' reason label).
        by: AcceptCheck,
    },
}

/// The checks of [`Admission::on_accept`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AcceptCheck {
    /// Too few file descriptors would remain.
    OpenFiles,
    /// The source address's bucket was empty.
    AddressRate,
    /// The global bucket was empty.
    Rate,
}

impl Decision {
    fn refuse(r: Refusal, by: AcceptCheck) -> Self {
        Decision::Refuse {
            status: r.status,
            retry_after: r.retry_after,
            by,
        }
    }
}

/// A stage whose hint [`Admission::hint`] gives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Stage {
    /// The global connection bucket at accept.
    Accept,
    /// OpenSecureChannel handshakes in flight.
    Handshake,
    /// Session establishment.
    Establishment,
    /// Connections closing: what frees channels (`max_channel_count`) and
    /// descriptors (`open_files_headroom`).
    Connections,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

#[derive(Debug)]
struct AcceptState {
    global: TokenBucket,
    /// Refusals by the global bucket, fading: the demand that comes back.
    refused: DecayingCount,
    addresses: AddressBuckets,
    jitter: Jitter,
}

#[derive(Debug)]
struct Closes {
    rate: CompletionRate,
    jitter: Jitter,
}

/// The admission stages of a server (docs/scalability.md §2), built from the
/// `[admission]` section. Shared by every connection task: `&self`
/// methods, each stage behind its own short mutex.
///
/// Disabled (`enabled = false`, or [`Admission::disabled`]), every
/// connection, channel, handshake and establishment is admitted; the gates
/// still count.
#[derive(Debug)]
pub struct Admission {
    enabled: bool,
    accept: Mutex<AcceptState>,
    handshakes: HandshakeGate,
    establishment: EstablishmentGate,
    channels: ChannelCount,
    open_files_headroom: u64,
    closes: Mutex<Closes>,
}

impl Default for Admission {
    /// [`Admission::disabled`].
    fn default() -> Self {
        Admission::disabled()
    }
}

/// A seed for the hints' jitter that differs between processes.
fn random_seed() -> u64 {
    let mut b = [0u8; 8];
    match getrandom::getrandom(&mut b) {
        Ok(()) => u64::from_le_bytes(b),
        Err(_) => u64::from(std::process::id()) | 1 << 40,
    }
}

/// A different seed per stage from one seed (splitmix64's increment).
fn stage_seed(seed: u64, stage: u64) -> u64 {
    seed.wrapping_add(stage.wrapping_mul(0x9E37_79B9_7F4A_7C15))
}

impl Admission {
    /// Every stage open: the behaviour before admission control, and of
    /// `enabled = false`.
    pub fn disabled() -> Self {
        Admission {
            enabled: false,
            accept: Mutex::new(AcceptState {
                global: TokenBucket::new(u32::MAX, u32::MAX),
                refused: DecayingCount::new(RATE_TIME_CONSTANT),
                addresses: AddressBuckets::new(u32::MAX, u32::MAX, 8),
                jitter: Jitter::new(1),
            }),
            handshakes: HandshakeGate::unlimited(),
            establishment: EstablishmentGate::unlimited(),
            channels: ChannelCount::new(usize::MAX),
            open_files_headroom: 0,
            closes: Mutex::new(Closes {
                rate: CompletionRate::default(),
                jitter: Jitter::new(1),
            }),
        }
    }

    /// The stages of `config`'s `[admission]` section, its derived values
    /// resolved with `cpus` ([`ServerConfig::resolved`]), the hints' jitter
    /// seeded at random.
    pub fn new(config: &ServerConfig, cpus: usize) -> Self {
        Self::with_seed(config, cpus, random_seed())
    }

    /// [`Admission::new`] with the jitter seeded by `seed` (tests).
    pub fn with_seed(config: &ServerConfig, cpus: usize, seed: u64) -> Self {
        let resolved = config.resolved(cpus);
        let a = resolved.admission;
        if !a.enabled {
            return Self::disabled();
        }
        let derived = |v: Option<usize>, d: usize| v.unwrap_or(d);
        let per_address_rate = a.connections_per_second_per_address.unwrap_or(1);
        let per_address_burst = a.connection_burst_per_address.unwrap_or(1);
        Admission {
            enabled: true,
            accept: Mutex::new(AcceptState {
                global: TokenBucket::new(a.connections_per_second, a.connection_burst),
                refused: DecayingCount::new(RATE_TIME_CONSTANT),
                addresses: AddressBuckets::new(
                    per_address_rate,
                    per_address_burst,
                    DEFAULT_ADDRESS_TABLE_CAPACITY,
                ),
                jitter: Jitter::new(stage_seed(seed, 1)),
            }),
            handshakes: HandshakeGate::new(
                derived(a.max_concurrent_handshakes, 2),
                a.max_unfinished_handshakes_per_address,
                stage_seed(seed, 2),
            ),
            establishment: EstablishmentGate::new(
                derived(a.max_concurrent_session_establishment, 128),
                a.session_establishment_queue_limit,
                stage_seed(seed, 3),
            ),
            channels: ChannelCount::new(derived(
                a.max_channel_count,
                resolved.server.max_session_count,
            )),
            open_files_headroom: a.open_files_headroom.into(),
            closes: Mutex::new(Closes {
                rate: CompletionRate::default(),
                jitter: Jitter::new(stage_seed(seed, 4)),
            }),
        }
    }

    /// Whether admission control is on.
    pub fn is_enabled(&self) -> bool {
        self.enabled
    }

    /// Decides on a connection from `peer` accepted at `now`, while
    /// `open_connections` connections are open (this one included) and the
    /// soft open-files limit is `open_files_soft_limit` (from
    /// [`host::raise_open_files_limit`] at start; `None` = unlimited or
    /// unknown, no check). In order:
    ///
    /// 1. open files: refused when fewer than `open_files_headroom`
    ///    descriptors would remain (`open_connections` stands for the
    ///    descriptors in use; the headroom covers the rest);
    /// 2. the bucket of `peer`'s address (IPv4 address, IPv6 /64);
    /// 3. the global bucket (a refusal here gives the address its token
    ///    back).
    ///
    /// A refusal is `BadTcpServerTooBusy` with the stage's hint.
    pub fn on_accept(
        &self,
        peer: SocketAddr,
        now: Instant,
        open_connections: usize,
        open_files_soft_limit: Option<u64>,
    ) -> Decision {
        if !self.enabled {
            return Decision::Admit;
        }
        if let Some(soft) = open_files_soft_limit {
            let remaining = soft.saturating_sub(open_connections as u64);
            // A quarter of a small limit at most: a process started with
            // 64 descriptors still serves.
            let headroom = self.open_files_headroom.min(soft / 4);
            if remaining < headroom {
                // The connections that must close first.
                let backlog = (headroom - remaining) as f64;
                return Decision::refuse(self.closes_refusal(backlog, now), AcceptCheck::OpenFiles);
            }
        }
        let mut s = lock(&self.accept);
        let s = &mut *s;
        if let AddressVerdict::Refuse { wait, refused } = s.addresses.try_take(peer.ip(), now) {
            let rate = s.addresses.rate_per_s();
            return Decision::refuse(
                Refusal {
                    status: StatusCode::BadTcpServerTooBusy,
                    retry_after: bucket_hint(wait, refused, rate, &mut s.jitter),
                },
                AcceptCheck::AddressRate,
            );
        }
        match s.global.try_take(now) {
            Ok(()) => Decision::Admit,
            Err(wait) => {
                s.addresses.give_back(peer.ip());
                s.refused.add(now, 1.0);
                let refused = s.refused.value(now);
                let rate = s.global.rate_per_s();
                Decision::refuse(
                    Refusal {
                        status: StatusCode::BadTcpServerTooBusy,
                        retry_after: bucket_hint(wait, refused, rate, &mut s.jitter),
                    },
                    AcceptCheck::Rate,
                )
            }
        }
    }

    /// A connection closed at `now`: feeds the rate that the hints of
    /// `max_channel_count` and `open_files_headroom` refusals divide by.
    pub fn connection_closed(&self, now: Instant) {
        lock(&self.closes).rate.record(now);
    }

    /// What to do with a new secure channel while `open` channels are open
    /// and `has_sessionless` says whether one has no session
    /// ([`ChannelCount::decide`]); always `Admit` when disabled. On
    /// `Refuse`, answer with [`Admission::channel_refusal`].
    pub fn channel_decision(&self, open: usize, has_sessionless: bool) -> ChannelDecision {
        if !self.enabled {
            return ChannelDecision::Admit;
        }
        self.channels.decide(open, has_sessionless)
    }

    /// The refusal of a channel over `max_channel_count`:
    /// `BadTcpServerTooBusy`, the hint one connection's closing away.
    pub fn channel_refusal(&self, now: Instant) -> Refusal {
        self.closes_refusal(1.0, now)
    }

    fn closes_refusal(&self, backlog: f64, now: Instant) -> Refusal {
        let mut c = lock(&self.closes);
        let c = &mut *c;
        let rate = c.rate.per_second(now);
        Refusal {
            status: StatusCode::BadTcpServerTooBusy,
            retry_after: hint::retry_after(backlog, rate, &mut c.jitter),
        }
    }

    /// The OpenSecureChannel gate (`max_concurrent_handshakes`,
    /// `max_unfinished_handshakes_per_address`).
    pub fn handshakes(&self) -> &HandshakeGate {
        &self.handshakes
    }

    /// The session-establishment gate
    /// (`max_concurrent_session_establishment`,
    /// `session_establishment_queue_limit`).
    pub fn establishment(&self) -> &EstablishmentGate {
        &self.establishment
    }

    /// The `max_channel_count` policy.
    pub fn channels(&self) -> ChannelCount {
        self.channels
    }

    /// The hint `stage` would give at `now` (jittered; docs/scalability.md,
    /// "The retry-after hint").
    pub fn hint(&self, stage: Stage, now: Instant) -> Duration {
        match stage {
            Stage::Accept => {
                let mut s = lock(&self.accept);
                let s = &mut *s;
                let wait = s.global.wait(now);
                let refused = s.refused.value(now);
                let rate = s.global.rate_per_s();
                bucket_hint(wait, refused, rate, &mut s.jitter)
            }
            Stage::Handshake => self.handshakes.hint(now),
            Stage::Establishment => self.establishment.hint(now),
            Stage::Connections => self.closes_refusal(1.0, now).retry_after,
        }
    }
}

/// A bucket's hint: the refused demand (a fading count of the refusals of
/// the last few seconds, which will come back) over the bucket's rate, and
/// at least the time until its next token; clamped and jittered as every
/// hint.
fn bucket_hint(wait: Duration, refused: f64, rate_per_s: u32, jitter: &mut Jitter) -> Duration {
    let spread = hint::base_retry_after(refused, Some(f64::from(rate_per_s)));
    let base = spread.max(wait.clamp(hint::HINT_MIN, hint::HINT_MAX));
    hint::jittered(base, jitter)
}

/// The reason text of a busy ERR: the hint as the token `RetryAfterMs=N`
/// (milliseconds, rounded up) that clients parse.
pub fn busy_reason(retry_after: Duration) -> String {
    let ms = retry_after.as_nanos().div_ceil(1_000_000);
    format!("server too busy; RetryAfterMs={ms}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    fn peer(s: &str) -> SocketAddr {
        SocketAddr::new(s.parse().unwrap(), 50_000)
    }

    impl Admission {
        /// [`Admission::on_accept`] without the open-files check.
        fn on_connection(&self, peer: SocketAddr, now: Instant) -> Decision {
            self.on_accept(peer, now, 0, None)
        }
    }

    fn refused(d: Decision) -> Duration {
        match d {
            Decision::Refuse {
                status,
                retry_after,
                ..
            } => {
                assert_eq!(status, StatusCode::BadTcpServerTooBusy);
                retry_after
            }
            Decision::Admit => panic!("admitted"),
        }
    }

    fn config(f: impl FnOnce(&mut crate::config::AdmissionSection)) -> ServerConfig {
        let mut c = ServerConfig::default();
        f(&mut c.admission);
        c
    }

    #[test]
    fn the_busy_reason_carries_the_hint_rounded_up() {
        assert_eq!(
            busy_reason(Duration::from_micros(2_001)),
            "server too busy; RetryAfterMs=3"
        );
    }

    #[test]
    fn disabled_admits_everything() {
        let t0 = Instant::now();
        for a in [
            Admission::disabled(),
            Admission::with_seed(&config(|a| a.enabled = false), 2, 1),
        ] {
            assert!(!a.is_enabled());
            for i in 0..10_000u64 {
                let d = a.on_accept(peer("192.0.2.1"), t0 + ms(i / 100), 1 << 20, Some(10));
                assert_eq!(d, Decision::Admit);
            }
            assert_eq!(
                a.channel_decision(usize::MAX - 1, false),
                ChannelDecision::Admit
            );
            let _g: Vec<_> = (0..1000)
                .map(|_| {
                    a.handshakes()
                        .try_begin(peer("192.0.2.1").ip(), t0)
                        .unwrap()
                })
                .collect();
            let _e: Vec<_> = (0..1000)
                .map(|_| a.establishment().try_enter(t0).unwrap())
                .collect();
        }
    }

    #[test]
    fn the_configuration_sizes_the_stages() {
        let a = Admission::with_seed(&ServerConfig::default(), 4, 1);
        assert!(a.is_enabled());
        assert_eq!(a.handshakes().capacity(), 8);
        assert_eq!(a.establishment().capacity(), 128);
        assert_eq!(a.channels().max(), 22_000);
        let a = Admission::with_seed(
            &config(|a| {
                a.max_concurrent_handshakes = Some(3);
                a.max_channel_count = Some(5);
                a.max_concurrent_session_establishment = Some(7);
            }),
            4,
            1,
        );
        assert_eq!(a.handshakes().capacity(), 3);
        assert_eq!(a.establishment().capacity(), 7);
        assert_eq!(
            a.channel_decision(5, true),
            ChannelDecision::EvictOldestSessionless
        );
        assert_eq!(a.channel_decision(5, false), ChannelDecision::Refuse);
        assert_eq!(a.channel_decision(4, false), ChannelDecision::Admit);
        let r = a.channel_refusal(Instant::now());
        assert_eq!(r.status, StatusCode::BadTcpServerTooBusy);
        assert!(r.retry_after >= ms(800) && r.retry_after <= ms(1200));
    }

    #[test]
    fn one_address_gets_its_share_and_the_rest_the_global_bucket() {
        let t0 = Instant::now();
        // Defaults: 500/s burst 1000 overall; 62/s burst 125 per address.
        let a = Admission::with_seed(&ServerConfig::default(), 2, 7);
        let one = peer("198.51.100.7");
        let admitted = (0..1000)
            .filter(|_| a.on_connection(one, t0) == Decision::Admit)
            .count();
        assert_eq!(admitted, 125);
        // Other addresses still get in: 1000 - 125 from the global bucket.
        let mut admitted = 0;
        for i in 0..2000u32 {
            let p = SocketAddr::new(std::net::Ipv4Addr::from(0xC633_6400 + i).into(), 1);
            if a.on_connection(p, t0) == Decision::Admit {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 875);
        // Refilled at 500/s: a second later 500 more.
        let t1 = t0 + Duration::from_secs(1);
        let mut admitted = 0;
        for i in 0..1000u32 {
            let p = SocketAddr::new(std::net::Ipv4Addr::from(0xCB00_7100 + i).into(), 1);
            if a.on_connection(p, t1) == Decision::Admit {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 500);
    }

    #[test]
    fn a_refusal_by_the_global_bucket_gives_the_address_its_token_back() {
        let t0 = Instant::now();
        let a = Admission::with_seed(
            &config(|a| {
                a.connections_per_second = 1;
                a.connection_burst = 1;
            }),
            2,
            7,
        );
        assert_eq!(a.on_connection(peer("192.0.2.1"), t0), Decision::Admit);
        // 192.0.2.2 is refused by the global bucket only ...
        refused(a.on_connection(peer("192.0.2.2"), t0));
        // ... so a second later, with one global token, it gets in.
        assert_eq!(
            a.on_connection(peer("192.0.2.2"), t0 + Duration::from_secs(1)),
            Decision::Admit
        );
    }

    #[test]
    fn the_accept_hint_spreads_the_refused_demand_over_the_rate() {
        let t0 = Instant::now();
        let a = Admission::with_seed(
            &config(|a| {
                a.connections_per_second = 100;
                a.connection_burst = 100;
            }),
            2,
            7,
        );
        let mut i = 0u32;
        let mut next = || {
            i += 1;
            SocketAddr::new(std::net::Ipv4Addr::from(0x0A00_0000 + i).into(), 1)
        };
        for _ in 0..100 {
            assert_eq!(a.on_connection(next(), t0), Decision::Admit);
        }
        // The first refusal: the next token is 10 ms away, so the minimum.
        let first = refused(a.on_connection(next(), t0));
        assert!(first >= ms(80) && first <= ms(120), "{first:?}");
        // 1000 more refused at once: 1001 waiting at 100 a second, 10 s.
        let mut last = Duration::ZERO;
        for _ in 0..1000 {
            last = refused(a.on_connection(next(), t0));
        }
        assert!(last >= ms(8000) && last <= ms(12_100), "{last:?}");
        let h = a.hint(Stage::Accept, t0);
        assert!(h >= ms(8000) && h <= ms(12_100), "{h:?}");
        // The refused demand fades: 20 s later the hint is short again.
        let later = a.hint(Stage::Accept, t0 + Duration::from_secs(20));
        assert!(later <= ms(300), "{later:?}");
    }

    #[test]
    fn the_open_files_headroom_refuses_near_the_limit() {
        let t0 = Instant::now();
        let a = Admission::with_seed(&config(|a| a.open_files_headroom = 64), 2, 7);
        let p = peer("192.0.2.1");
        assert_eq!(a.on_accept(p, t0, 1000 - 64, Some(1000)), Decision::Admit);
        let wait = refused(a.on_accept(p, t0, 1000 - 63, Some(1000)));
        assert!(wait >= ms(800) && wait <= ms(1200), "{wait:?}");
        // No limit known, or headroom 0: no check.
        assert_eq!(a.on_accept(p, t0, 5000, None), Decision::Admit);
        let off = Admission::with_seed(&config(|a| a.open_files_headroom = 0), 2, 7);
        assert_eq!(off.on_accept(p, t0, 1000, Some(1000)), Decision::Admit);
        // With connections closing at 10 a second, 10 over the line wait
        // about a second.
        let mut t = t0;
        for _ in 0..100 {
            t += ms(100);
            a.connection_closed(t);
        }
        let wait = refused(a.on_accept(p, t, 1000 - 54, Some(1000)));
        assert!(wait >= ms(800) && wait <= ms(1250), "{wait:?}");
        let h = a.hint(Stage::Connections, t);
        assert!(h >= ms(80) && h <= ms(125), "{h:?}");
    }

    #[test]
    fn every_stage_has_a_hint_in_range() {
        let t0 = Instant::now();
        let a = Admission::with_seed(&ServerConfig::default(), 2, 7);
        for stage in [
            Stage::Accept,
            Stage::Handshake,
            Stage::Establishment,
            Stage::Connections,
        ] {
            let h = a.hint(stage, t0);
            assert!(
                h >= ms(80) && h <= Duration::from_secs(36),
                "{stage:?} {h:?}"
            );
        }
        assert_eq!(
            Decision::refuse(
                Refusal {
                    status: StatusCode::BadTcpServerTooBusy,
                    retry_after: ms(5)
                },
                AcceptCheck::Rate
            ),
            Decision::Refuse {
                status: StatusCode::BadTcpServerTooBusy,
                retry_after: ms(5),
                by: AcceptCheck::Rate
            }
        );
    }
}
