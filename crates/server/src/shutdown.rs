//! A planned shutdown (Part 5 §6.3.1, `ServerStatus`): when it is due, why,
//! and when the server expects to be back. Sans-IO: the network layer
//! ([`crate::net`]) waits for [`Shutdown::due`] and closes the channels
//! then; until then the server serves its sessions and tells them, through
//! `ServerStatus.State` = Shutdown, a `SecondsTillShutdown` counting down,
//! the `ShutdownReason` and `EstimatedReturnTime`, and a ServiceLevel of 0
//! (Maintenance), while `/readyz` answers 503 and CreateSession is refused.
//!
//! A shutdown is planned by a signal (`uascale serve` on SIGTERM or
//! Ctrl-C, after `[server] shutdown_delay_s`), or by an administrator
//! calling `Server.RequestServerStateChange` ([`request_state_change`]).
//! The latest plan wins: a second Ctrl-C stops at once, and an
//! administrator may postpone, bring forward or (with State Running)
//! cancel a shutdown that is not yet due.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use uascale_types::{DateTime, LocalizedText, ServerState, StatusCode, Variant};

/// A shutdown that is planned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    /// When the channels close.
    pub due: Instant,
    /// When the shutdown was planned: a request stamped before it (decoded
    /// earlier, answered after) counts from here, so it never reads more
    /// than the delay.
    pub planned_at: Instant,
    /// Why (`ShutdownReason`).
    pub reason: String,
    /// When the server expects to serve again (`EstimatedReturnTime`), if
    /// known.
    pub estimated_return: Option<DateTime>,
}

impl Planned {
    /// `SecondsTillShutdown` at `now`: the seconds left, rounded up (0 once
    /// due).
    pub fn seconds_till(&self, now: Instant) -> u32 {
        let left = self.due.saturating_duration_since(now.max(self.planned_at));
        let secs = left.as_secs() + u64::from(left.subsec_nanos() > 0);
        u32::try_from(secs).unwrap_or(u32::MAX)
    }
}

/// What runs when a plan changes (the network layer's wake-up).
pub type Waker = Box<dyn Fn() + Send + Sync>;

/// The planned shutdown of a server, if any.
#[derive(Default)]
pub struct Shutdown {
    planned: Mutex<Option<Planned>>,
    waker: Mutex<Option<Waker>>,
    /// Set when the server is told to stop at once (a second signal): no
    /// drain then.
    at_once: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Shutdown {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shutdown")
            .field("planned", &self.planned())
            .finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shutdown {
    /// Plans the shutdown `delay` after `now` (replacing any earlier plan),
    /// and wakes whoever waits for it.
    pub fn plan(
        &self,
        now: Instant,
        delay: Duration,
        reason: &str,
        estimated_return: Option<DateTime>,
    ) -> Planned {
        let planned = Planned {
            due: now + delay,
            planned_at: now,
            reason: reason.to_owned(),
            estimated_return,
        };
        *lock(&self.planned) = Some(planned.clone());
        tracing::info!(
            seconds = delay.as_secs_f64(),
            reason,
            "shutdown planned: new sessions refused, channels close when it is due"
        );
        self.wake();
        planned
    }

    /// Cancels a planned shutdown; true if there was one.
    pub fn cancel(&self) -> bool {
        let was = lock(&self.planned).take().is_some();
        if was {
            tracing::info!("planned shutdown cancelled");
            self.wake();
        }
        was
    }

    /// The plan, if any.
    pub fn planned(&self) -> Option<Planned> {
        lock(&self.planned).clone()
    }

    /// True while a shutdown is planned.
    pub fn is_planned(&self) -> bool {
        lock(&self.planned).is_some()
    }

    /// When the channels close, if planned.
    pub fn due(&self) -> Option<Instant> {
        lock(&self.planned).as_ref().map(|p| p.due)
    }

    /// Notes that the server stops at once, without draining.
    pub fn stop_at_once(&self) {
        self.at_once
            .store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// Whether the server stops after its planned shutdown came due (and
    /// may drain), rather than at once.
    pub fn stops_as_planned(&self) -> bool {
        self.is_planned() && !self.at_once.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Sets what runs whenever the plan changes (one waker; a second call
    /// replaces the first).
    pub fn set_waker(&self, waker: Waker) {
        *lock(&self.waker) = Some(waker);
    }

    fn wake(&self) {
        if let Some(w) = lock(&self.waker).as_ref() {
            w();
        }
    }
}

/// Whether a session's user may change the server's state: the user names
/// and X509 thumbprints listed in `[server] admin_users`.
pub fn is_admin(admins: &[String], user: &crate::identity::UserIdentity) -> bool {
    use crate::identity::UserIdentity;
    match user {
        UserIdentity::Anonymous => false,
        UserIdentity::UserName(name) => admins.iter().any(|a| a == name && !a.starts_with("x509:")),
        UserIdentity::X509(cert) => {
            let hex: String = cert.thumbprint.iter().map(|b| format!("{b:02x}")).collect();
            admins.iter().any(|a| {
                a.strip_prefix("x509:")
                    .is_some_and(|t| t.eq_ignore_ascii_case(&hex))
            })
        }
    }
}

/// `Server.RequestServerStateChange` (Part 5 §6.3.1, i=12886) with its five
/// inputs (State, EstimatedReturnTime, SecondsTillShutdown, Reason,
/// Restart), called by an administrator at `now`:
/// - State Shutdown plans the shutdown SecondsTillShutdown from now;
/// - State Running cancels a planned one (Good also when none was);
/// - any other state, and Restart true, are `BadNotSupported` (a server
///   process does not restart itself; its supervisor starts it again).
///
/// The inputs' types were checked against the method's InputArguments.
pub fn request_state_change(
    shutdown: &Shutdown,
    now: Instant,
    inputs: &[Variant],
) -> Result<Vec<Variant>, StatusCode> {
    let [state, estimated, seconds, reason, restart] = inputs else {
        return Err(StatusCode::BadArgumentsMissing);
    };
    let state = match state {
        Variant::Int32(s) => ServerState(*s),
        _ => return Err(StatusCode::BadTypeMismatch),
    };
    let estimated = match estimated {
        Variant::DateTime(t) if *t > DateTime::MIN => Some(*t),
        Variant::DateTime(_) => None,
        _ => return Err(StatusCode::BadTypeMismatch),
    };
    let Variant::UInt32(seconds) = seconds else {
        return Err(StatusCode::BadTypeMismatch);
    };
    let reason = match reason {
        Variant::LocalizedText(t) => t.text.as_str_or_empty().to_owned(),
        _ => return Err(StatusCode::BadTypeMismatch),
    };
    let Variant::Boolean(restart) = restart else {
        return Err(StatusCode::BadTypeMismatch);
    };
    if *restart {
        return Err(StatusCode::BadNotSupported);
    }
    match state {
        ServerState::Shutdown => {
            let reason = if reason.is_empty() {
                "shutdown requested by an administrator".to_owned()
            } else {
                reason
            };
            shutdown.plan(
                now,
                Duration::from_secs(u64::from(*seconds)),
                &reason,
                estimated,
            );
            Ok(vec![])
        }
        ServerState::Running => {
            shutdown.cancel();
            Ok(vec![])
        }
        _ => Err(StatusCode::BadNotSupported),
    }
}

/// The `ShutdownReason` of `planned` (empty without a plan).
pub fn reason_text(planned: Option<&Planned>) -> LocalizedText {
    match planned {
        Some(p) => LocalizedText::new("en", p.reason.as_str()),
        None => LocalizedText::default(),
    }
}

#[cfg(test)]
// Tests take one real instant as the origin of their simulated time.
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;
    use crate::identity::{UserIdentity, X509User};

    fn inputs(state: ServerState, secs: u32, reason: &str, restart: bool) -> Vec<Variant> {
        vec![
            Variant::Int32(state.0),
            Variant::DateTime(DateTime::MIN),
            Variant::UInt32(secs),
            Variant::LocalizedText(Box::new(LocalizedText::new("en", reason))),
            Variant::Boolean(restart),
        ]
    }

    #[test]
    fn seconds_till_shutdown_count_down_rounded_up() {
        let t0 = Instant::now();
        let s = Shutdown::default();
        assert_eq!(s.planned(), None);
        let p = s.plan(t0, Duration::from_secs(3), "test", None);
        assert_eq!(p.seconds_till(t0), 3);
        assert_eq!(p.seconds_till(t0 + Duration::from_millis(1)), 3);
        assert_eq!(p.seconds_till(t0 + Duration::from_millis(1000)), 2);
        assert_eq!(p.seconds_till(t0 + Duration::from_millis(2500)), 1);
        assert_eq!(p.seconds_till(t0 + Duration::from_secs(3)), 0);
        assert_eq!(p.seconds_till(t0 + Duration::from_secs(9)), 0);
        // A request stamped before the plan reads at most the delay.
        let later = t0 + Duration::from_millis(300);
        let p = s.plan(later, Duration::from_secs(3), "test", None);
        assert_eq!(p.seconds_till(t0), 3);
        s.plan(t0, Duration::from_secs(3), "test", None);
        assert_eq!(s.due(), Some(t0 + Duration::from_secs(3)));
    }

    #[test]
    fn the_latest_plan_wins_and_a_change_wakes_the_waiter() {
        let t0 = Instant::now();
        let s = Shutdown::default();
        let woken = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let w = std::sync::Arc::clone(&woken);
        s.set_waker(Box::new(move || {
            w.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }));
        s.plan(t0, Duration::from_secs(30), "first", None);
        s.plan(t0, Duration::ZERO, "second", None);
        assert_eq!(s.due(), Some(t0));
        assert_eq!(s.planned().unwrap().reason, "second");
        assert!(s.cancel());
        assert!(!s.cancel());
        assert!(!s.is_planned());
        assert_eq!(woken.load(std::sync::atomic::Ordering::Relaxed), 3);
    }

    #[test]
    fn request_state_change_plans_cancels_and_refuses_the_rest() {
        let t0 = Instant::now();
        let s = Shutdown::default();
        let r = request_state_change(&s, t0, &inputs(ServerState::Shutdown, 10, "upgrade", false));
        assert_eq!(r, Ok(vec![]));
        let p = s.planned().unwrap();
        assert_eq!((p.seconds_till(t0), p.reason.as_str()), (10, "upgrade"));
        assert_eq!(p.estimated_return, None);
        // The estimated return time is kept; an empty reason gets one.
        let mut with_return = inputs(ServerState::Shutdown, 5, "", false);
        let back = DateTime::from_ticks(1_000_000);
        with_return[1] = Variant::DateTime(back);
        request_state_change(&s, t0, &with_return).unwrap();
        let p = s.planned().unwrap();
        assert_eq!(p.estimated_return, Some(back));
        assert!(!p.reason.is_empty());
        // Running cancels.
        request_state_change(&s, t0, &inputs(ServerState::Running, 0, "", false)).unwrap();
        assert!(!s.is_planned());
        for bad in [
            inputs(ServerState::Shutdown, 1, "", true),
            inputs(ServerState::Suspended, 1, "", false),
            inputs(ServerState::Test, 1, "", false),
        ] {
            assert_eq!(
                request_state_change(&s, t0, &bad),
                Err(StatusCode::BadNotSupported)
            );
        }
        assert!(!s.is_planned());
        assert_eq!(
            request_state_change(&s, t0, &inputs(ServerState::Shutdown, 1, "", false)[..4]),
            Err(StatusCode::BadArgumentsMissing)
        );
    }

    #[test]
    fn administrators_are_the_listed_users_and_certificates() {
        let admins = vec!["ops".to_owned(), format!("x509:{}", "AB".repeat(20))];
        assert!(is_admin(&admins, &UserIdentity::UserName("ops".into())));
        assert!(!is_admin(&admins, &UserIdentity::UserName("guest".into())));
        assert!(!is_admin(&admins, &UserIdentity::Anonymous));
        let cert = |b: u8| {
            UserIdentity::X509(Box::new(X509User {
                subject: "CN=ops".into(),
                thumbprint: [b; 20],
            }))
        };
        assert!(is_admin(&admins, &cert(0xab)));
        assert!(!is_admin(&admins, &cert(0xac)));
        // A user named like a certificate entry is not one.
        assert!(!is_admin(
            &admins,
            &UserIdentity::UserName(format!("x509:{}", "ab".repeat(20)))
        ));
        assert!(!is_admin(&[], &UserIdentity::UserName("ops".into())));
    }
}
