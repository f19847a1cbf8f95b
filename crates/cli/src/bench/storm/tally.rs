//! What the storm's clients went through, counted per behaviour: attempts
//! and how each failed, busy answers by stage and whether they carried a
//! retry-after hint, the hints, time to establish. A [`Delta`] is what
//! happened since it was last taken; child processes print theirs as JSON
//! lines and the parent adds them up, so the same type serves both.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use uascale_client::{ClientError, OpenStage};
use uascale_types::StatusCode;

/// How a storm client behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Behaviour {
    /// A fixed per-attempt timeout; on any failure a new connection and
    /// session at once.
    Naive,
    /// `Client::open` as shipped: the §7 backoff (hints as a lower bound),
    /// the connect gate, transient statuses only, bounded attempts.
    Cooperative,
}

/// `--behaviour`: which behaviours the clients have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mix {
    /// Every client naive.
    Naive,
    /// Every client cooperative.
    Cooperative,
    /// The first half (rounded up) cooperative, the rest naive.
    Mixed,
}

impl Mix {
    /// `naive`, `cooperative` or `mixed`.
    pub fn parse(text: &str) -> Result<Mix, String> {
        match text {
            "naive" => Ok(Mix::Naive),
            "cooperative" => Ok(Mix::Cooperative),
            "mixed" => Ok(Mix::Mixed),
            other => Err(format!(
                "--behaviour {other:?}: give naive, cooperative or mixed"
            )),
        }
    }

    /// The flag's word.
    pub fn name(self) -> &'static str {
        match self {
            Mix::Naive => "naive",
            Mix::Cooperative => "cooperative",
            Mix::Mixed => "mixed",
        }
    }

    /// The behaviour of client `index` of `clients`. Clients are dealt to
    /// processes round robin, so every process gets both halves of a mix.
    pub fn of(self, index: usize, clients: usize) -> Behaviour {
        match self {
            Mix::Naive => Behaviour::Naive,
            Mix::Cooperative => Behaviour::Cooperative,
            Mix::Mixed if index < clients.div_ceil(2) => Behaviour::Cooperative,
            Mix::Mixed => Behaviour::Naive,
        }
    }

    /// How many of `clients` are naive.
    pub fn naive_count(self, clients: usize) -> usize {
        (0..clients)
            .filter(|&i| self.of(i, clients) == Behaviour::Naive)
            .count()
    }
}

/// The stage names of the output.
pub fn stage_name(stage: OpenStage) -> &'static str {
    match stage {
        OpenStage::Connect => "connect",
        OpenStage::CreateSession => "create_session",
        OpenStage::ActivateSession => "activate_session",
    }
}

/// A busy answer's bucket: `connect` (refused while connecting: TCP,
/// Hello, OpenSecureChannel - an ERR BadTcpServerTooBusy), `session`
/// (refused at CreateSession or ActivateSession - a ServiceFault
/// BadServerTooBusy) or `too_many_sessions` (BadTooManySessions, wherever
/// it came). `None` when `e` is no busy answer: not a server answer (a
/// timeout, a broken connection) or not a busy status.
pub fn busy_bucket(stage: OpenStage, e: &ClientError) -> Option<&'static str> {
    let status = e.status_code();
    let answered = matches!(e, ClientError::Channel { .. } | ClientError::Service { .. });
    if !answered
        || status == StatusCode::BadTimeout
        || !uascale_client::backoff::is_busy_signal(status)
    {
        return None;
    }
    Some(if status == StatusCode::BadTooManySessions {
        "too_many_sessions"
    } else if stage == OpenStage::Connect {
        "connect"
    } else {
        "session"
    })
}

/// `connect ERR BadTcpServerTooBusy`: stage, kind of answer and status.
pub fn answer_name(stage: OpenStage, e: &ClientError) -> String {
    let kind = match e {
        ClientError::Channel { .. } => "ERR",
        ClientError::Service { .. } => "ServiceFault",
        _ => "error",
    };
    format!("{} {kind} {}", stage_name(stage), e.status_code())
}

/// What one behaviour's clients went through (since the last take, or in
/// all once added up).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Part {
    /// Attempts that ended (succeeded or failed; one cut short by the end
    /// of the storm is not counted).
    pub attempts: u64,
    /// Failed attempts followed by another attempt.
    pub retries: u64,
    /// Clients with an activated session.
    pub established: u64,
    /// Per established client, microseconds from the storm's start.
    pub establish_us: Vec<u64>,
    /// Failed attempts: stage, then status name.
    pub failures: BTreeMap<String, BTreeMap<String, u64>>,
    /// Busy answers (see [`busy_bucket`]).
    pub busy: u64,
    /// Of those, the ones that carried a `RetryAfterMs` hint.
    pub busy_with_hint: u64,
    /// Busy answers by bucket.
    pub busy_by_stage: BTreeMap<String, u64>,
    /// Busy answers by stage, kind of answer and status.
    pub busy_by_answer: BTreeMap<String, u64>,
    /// Every retry-after hint received, in milliseconds.
    pub hints_ms: Vec<u64>,
    /// Waits before a retry after a hinted failure (cooperative clients).
    pub hinted_waits: u64,
    /// Of those, waits shorter than the hint (must stay 0).
    pub waits_below_hint: u64,
    /// Attempts given up after the server had created their session
    /// (ActivateSession failed, timed out or was cut short by the end of
    /// the storm): sessions left behind.
    pub orphans_left: u64,
    /// Clients that stopped trying before the end, by their last status.
    pub gave_up: BTreeMap<String, u64>,
    /// Clients still trying when the storm's time was up.
    pub cut_off: u64,
}

impl Part {
    /// An attempt that activated its session.
    pub fn attempt_succeeded(&mut self) {
        self.attempts += 1;
    }

    /// An attempt that failed in `stage` with `e`; `retried` when another
    /// follows; `wait` is the wait before it when the client waits.
    pub fn attempt_failed(
        &mut self,
        stage: OpenStage,
        e: &ClientError,
        retried: bool,
        wait: Option<Duration>,
    ) {
        self.attempts += 1;
        if retried {
            self.retries += 1;
        }
        *self
            .failures
            .entry(stage_name(stage).to_owned())
            .or_default()
            .entry(e.status_code().to_string())
            .or_insert(0) += 1;
        if stage == OpenStage::ActivateSession {
            self.orphans_left += 1;
        }
        let hint = e.retry_after_ms();
        if let Some(h) = hint {
            self.hints_ms.push(h);
        }
        if let Some(bucket) = busy_bucket(stage, e) {
            self.busy += 1;
            if hint.is_some() {
                self.busy_with_hint += 1;
            }
            *self.busy_by_stage.entry(bucket.to_owned()).or_insert(0) += 1;
            *self
                .busy_by_answer
                .entry(answer_name(stage, e))
                .or_insert(0) += 1;
        }
        if let (Some(h), Some(w)) = (hint, wait) {
            self.hinted_waits += 1;
            if w < Duration::from_millis(h) {
                self.waits_below_hint += 1;
            }
        }
    }

    /// A client established `after` the storm's start.
    pub fn established(&mut self, after: Duration) {
        self.established += 1;
        self.establish_us
            .push(u64::try_from(after.as_micros()).unwrap_or(u64::MAX));
    }

    /// A client that stopped trying, with its last status.
    pub fn gave_up(&mut self, status: StatusCode) {
        *self.gave_up.entry(status.to_string()).or_insert(0) += 1;
    }

    /// Clients that gave up, in all.
    pub fn gave_up_count(&self) -> u64 {
        self.gave_up.values().sum()
    }

    /// Busy answers without a hint.
    pub fn busy_without_hint(&self) -> u64 {
        self.busy - self.busy_with_hint
    }

    /// Failed attempts by status over all stages.
    pub fn failures_by_status(&self) -> BTreeMap<String, u64> {
        let mut out = BTreeMap::new();
        for by_status in self.failures.values() {
            for (s, n) in by_status {
                *out.entry(s.clone()).or_insert(0) += n;
            }
        }
        out
    }

    /// Busy answers in `bucket`.
    pub fn busy_in(&self, bucket: &str) -> u64 {
        self.busy_by_stage.get(bucket).copied().unwrap_or(0)
    }

    /// Adds `other` to this one.
    pub fn absorb(&mut self, other: Part) {
        fn add(into: &mut BTreeMap<String, u64>, from: BTreeMap<String, u64>) {
            for (k, v) in from {
                *into.entry(k).or_insert(0) += v;
            }
        }
        self.attempts += other.attempts;
        self.retries += other.retries;
        self.established += other.established;
        self.establish_us.extend(other.establish_us);
        for (stage, by_status) in other.failures {
            add(self.failures.entry(stage).or_default(), by_status);
        }
        self.busy += other.busy;
        self.busy_with_hint += other.busy_with_hint;
        add(&mut self.busy_by_stage, other.busy_by_stage);
        add(&mut self.busy_by_answer, other.busy_by_answer);
        self.hints_ms.extend(other.hints_ms);
        self.hinted_waits += other.hinted_waits;
        self.waits_below_hint += other.waits_below_hint;
        self.orphans_left += other.orphans_left;
        add(&mut self.gave_up, other.gave_up);
        self.cut_off += other.cut_off;
    }
}

/// Both behaviours' parts.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Delta {
    /// The naive clients'.
    pub naive: Part,
    /// The cooperative clients'.
    pub cooperative: Part,
}

impl Delta {
    /// The part of `behaviour`.
    pub fn part(&mut self, behaviour: Behaviour) -> &mut Part {
        match behaviour {
            Behaviour::Naive => &mut self.naive,
            Behaviour::Cooperative => &mut self.cooperative,
        }
    }

    /// Adds `other` to this one.
    pub fn absorb(&mut self, other: Delta) {
        self.naive.absorb(other.naive);
        self.cooperative.absorb(other.cooperative);
    }

    /// Both parts added up.
    pub fn total(&self) -> Part {
        let mut t = self.naive.clone();
        t.absorb(self.cooperative.clone());
        t
    }
}

/// The `q` quantile (0..=1) of `sorted`; `None` when it is empty.
pub fn quantile(sorted: &[u64], q: f64) -> Option<u64> {
    if sorted.is_empty() {
        return None;
    }
    let rank = (q.clamp(0.0, 1.0) * sorted.len() as f64).ceil() as usize;
    Some(sorted[rank.clamp(1, sorted.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn service(status: StatusCode, hint: Option<u64>) -> ClientError {
        ClientError::Service {
            status,
            retry_after_ms: hint,
            retry_ticket: None,
        }
    }

    fn err(status: StatusCode, hint: Option<u64>) -> ClientError {
        ClientError::Channel {
            status,
            reason: String::new(),
            retry_after_ms: hint,
        }
    }

    #[test]
    fn busy_answers_are_bucketed_by_stage() {
        let tcp = err(StatusCode::BadTcpServerTooBusy, Some(500));
        assert_eq!(busy_bucket(OpenStage::Connect, &tcp), Some("connect"));
        assert_eq!(
            answer_name(OpenStage::Connect, &tcp),
            "connect ERR BadTcpServerTooBusy"
        );
        let fault = service(StatusCode::BadServerTooBusy, None);
        assert_eq!(
            busy_bucket(OpenStage::CreateSession, &fault),
            Some("session")
        );
        assert_eq!(
            busy_bucket(OpenStage::ActivateSession, &fault),
            Some("session")
        );
        let many = service(StatusCode::BadTooManySessions, None);
        assert_eq!(
            busy_bucket(OpenStage::CreateSession, &many),
            Some("too_many_sessions")
        );
        // Not answers, or not busy.
        assert_eq!(busy_bucket(OpenStage::Connect, &ClientError::Timeout), None);
        assert_eq!(
            busy_bucket(OpenStage::Connect, &ClientError::Io("refused".into())),
            None
        );
        assert_eq!(
            busy_bucket(
                OpenStage::CreateSession,
                &service(StatusCode::BadTimeout, None)
            ),
            None
        );
        assert_eq!(
            busy_bucket(
                OpenStage::Connect,
                &err(StatusCode::BadCertificateUntrusted, None)
            ),
            None
        );
    }

    #[test]
    fn attempts_count_hints_waits_and_orphans() {
        let mut p = Part::default();
        p.attempt_failed(
            OpenStage::Connect,
            &err(StatusCode::BadTcpServerTooBusy, Some(800)),
            true,
            Some(Duration::from_millis(3_900)),
        );
        p.attempt_failed(
            OpenStage::CreateSession,
            &service(StatusCode::BadServerTooBusy, None),
            true,
            Some(Duration::from_secs(8)),
        );
        // A wait shorter than the hint is caught.
        p.attempt_failed(
            OpenStage::CreateSession,
            &service(StatusCode::BadServerTooBusy, Some(2_000)),
            true,
            Some(Duration::from_millis(1_000)),
        );
        p.attempt_failed(
            OpenStage::ActivateSession,
            &ClientError::Timeout,
            false,
            None,
        );
        p.attempt_succeeded();
        p.established(Duration::from_millis(1500));
        p.gave_up(StatusCode::BadTimeout);
        assert_eq!((p.attempts, p.retries, p.established), (5, 3, 1));
        assert_eq!((p.busy, p.busy_with_hint, p.busy_without_hint()), (3, 2, 1));
        assert_eq!(p.hints_ms, vec![800, 2_000]);
        assert_eq!((p.hinted_waits, p.waits_below_hint), (2, 1));
        assert_eq!(p.orphans_left, 1);
        assert_eq!(p.busy_in("connect"), 1);
        assert_eq!(p.busy_in("session"), 2);
        assert_eq!(p.failures_by_status()["BadServerTooBusy"], 2);
        assert_eq!(p.failures["activate_session"]["BadTimeout"], 1);
        assert_eq!(p.establish_us, vec![1_500_000]);

        // Through JSON (as child processes send it) and added up.
        let mut d = Delta::default();
        *d.part(Behaviour::Cooperative) = p;
        d.naive.cut_off = 2;
        let back: Delta = serde_json::from_str(&serde_json::to_string(&d).unwrap()).unwrap();
        let mut sum = Delta::default();
        sum.absorb(back.clone());
        sum.absorb(back);
        let t = sum.total();
        assert_eq!(
            (t.attempts, t.busy, t.cut_off, t.gave_up_count()),
            (10, 6, 4, 2)
        );
        assert_eq!(t.failures["connect"]["BadTcpServerTooBusy"], 2);
        assert_eq!(t.busy_by_answer["connect ERR BadTcpServerTooBusy"], 2);
    }

    #[test]
    fn mixes_split_in_halves_and_quantiles() {
        assert_eq!(Mix::Mixed.naive_count(41), 20);
        assert_eq!(Mix::Mixed.of(0, 41), Behaviour::Cooperative);
        assert_eq!(Mix::Mixed.of(40, 41), Behaviour::Naive);
        assert_eq!(Mix::Naive.naive_count(3), 3);
        assert_eq!(Mix::Cooperative.naive_count(3), 0);
        assert!(Mix::parse("polite").is_err());
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(quantile(&v, 0.5), Some(50));
        assert_eq!(quantile(&v, 0.99), Some(99));
        assert_eq!(quantile(&v, 1.0), Some(100));
        assert_eq!(quantile(&v, 0.0), Some(1));
        assert_eq!(quantile(&[], 0.5), None);
    }
}
