//! The session table: sharded by authentication token so that creating,
//! activating and looking up sessions never takes one global lock, and
//! nothing in establishment scans all sessions (docs/scalability.md §1-2).
//!
//! Expiry is event-driven: a min-heap of deadlines per shard, re-checked
//! lazily, so an idle server with 10,000 sessions does no per-session work
//! per tick.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use uascale_types::{
    ByteString, DateTime, ExtensionObject, Identifier, NodeId, ReferenceDescription,
    SessionDiagnosticsDataType, StatusCode, UaString, Variant,
};

const SHARDS: usize = 64;

/// What a session of an ECC policy keeps beyond the others.
#[derive(Debug)]
pub struct EccSession {
    /// The CreateSession ClientNonce (channel-bound signatures cover it).
    pub client_nonce: Vec<u8>,
    /// The ephemeral key whose public half was the last ECDHKey sent; an
    /// EccEncryptedSecret must be encrypted for it.
    pub ephemeral: Option<uascale_crypto::ecc::EphemeralKey>,
}

/// One session's state (kept small: it is multiplied by the session count).
#[derive(Debug, Clone)]
pub struct Session {
    /// The public SessionId.
    pub session_id: NodeId,
    /// The secure channel the session is bound to.
    pub channel_id: u32,
    /// Revised timeout: closed when no request arrives for this long.
    pub timeout: Duration,
    /// When it times out (or, before activation, when the activation
    /// deadline passes).
    pub deadline: Instant,
    /// True after a successful ActivateSession.
    pub activated: bool,
    /// The client's session name.
    pub name: UaString,
    /// Locale ids from ActivateSession (a boxed slice: two words, not
    /// three).
    pub locale_ids: Box<[UaString]>,
    /// Browse continuation points (see [`ContinuationPoints`]); boxed and
    /// made on the first one, as most sessions never hold one.
    pub continuation_points: Option<Box<ContinuationPoints>>,
    /// The last nonce sent to the client (CreateSession, then each
    /// ActivateSession); the next ActivateSession's signatures and
    /// encrypted password must cover it.
    pub server_nonce: [u8; 32],
    /// Thumbprint of the client certificate of the channel that created the
    /// session (None on SecurityPolicy None); only a channel with the same
    /// certificate may take the session over.
    pub client_thumbprint: Option<[u8; 20]>,
    /// The client's ApplicationUri (the lockout key without a certificate).
    pub client_uri: UaString,
    /// Who activated the session.
    pub user: crate::identity::UserIdentity,
    /// When CreateSession made it (ClientConnectionTime in the diagnostics).
    pub created: DateTime,
    /// The EndpointUrl the client gave in CreateSession.
    pub endpoint_url: UaString,
    /// The security policy of the channel it was last activated on.
    pub security_policy: uascale_crypto::policy::SecurityPolicy,
    /// The security mode of that channel.
    pub security_mode: uascale_types::MessageSecurityMode,
    /// ECC policies only: the CreateSession ClientNonce and the ephemeral
    /// key last sent as ECDHKey (None on other policies: one pointer).
    pub ecc: Option<std::sync::Arc<EccSession>>,
}

impl Session {
    /// A copy for the cluster mirror: every field, and the continuation
    /// points without the references they hold back (the mirror keeps
    /// where each browse stopped, not its references).
    pub fn mirror_copy(&self) -> Session {
        Session {
            continuation_points: self.continuation_points.as_ref().map(|cps| {
                Box::new(
                    cps.iter()
                        .map(|c| ContinuationPoint {
                            id: c.id.clone(),
                            browse: c.browse.clone(),
                            max: c.max,
                            returned: c.returned,
                            rest: None,
                        })
                        .collect(),
                )
            }),
            session_id: self.session_id.clone(),
            channel_id: self.channel_id,
            timeout: self.timeout,
            deadline: self.deadline,
            activated: self.activated,
            name: self.name.clone(),
            locale_ids: self.locale_ids.clone(),
            server_nonce: self.server_nonce,
            client_thumbprint: self.client_thumbprint,
            client_uri: self.client_uri.clone(),
            user: self.user.clone(),
            created: self.created,
            endpoint_url: self.endpoint_url.clone(),
            security_policy: self.security_policy,
            security_mode: self.security_mode,
            ecc: self.ecc.clone(),
        }
    }
}

/// A session's Browse continuation points (at most
/// `max_browse_continuation_points`).
pub type ContinuationPoints = Vec<ContinuationPoint>;

/// One Browse continuation point: what BrowseNext needs to go on, and
/// what a cluster mirror copies of it (everything but `rest`).
#[derive(Debug, Clone, PartialEq)]
pub struct ContinuationPoint {
    /// Its id, as the client got it (random: not guessable).
    pub id: ByteString,
    /// The browse it continues: node, direction, reference type and
    /// subtypes, node class and result masks.
    pub browse: uascale_types::BrowseDescription,
    /// References per page: the max references per node of that Browse.
    pub max: usize,
    /// How many references of the browse were returned before it.
    pub returned: usize,
    /// The references still to return; `None` on a continuation point
    /// restored from a cluster mirror (BrowseNext then browses the node
    /// again and skips the `returned` first ones) or in a mirror's copy.
    pub rest: Option<Vec<ReferenceDescription>>,
}

#[derive(Debug, Default)]
struct Shard {
    /// Boxed: the map's spare slots (a hash table is kept at most 7/8 full
    /// and grows by doubling) then cost a pointer each, not a `Session`.
    sessions: HashMap<TokenKey, Box<Session>>,
    deadlines: BinaryHeap<Reverse<(Instant, u64, HeapKey)>>,
}

/// The table's key for an authentication token. The 32-byte opaque tokens
/// this server issues are kept inline - the map and the deadline heap
/// each hold a copy, and a `NodeId` copy would be one more allocation
/// each; any other NodeId (a client's made-up token) as it is.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum TokenKey {
    Issued([u8; 32]),
    Other(NodeId),
}

impl TokenKey {
    fn of(token: &NodeId) -> Self {
        let issued = match &token.identifier {
            Identifier::Opaque(b) if token.namespace == 0 => {
                b.as_bytes().and_then(|b| <[u8; 32]>::try_from(b).ok())
            }
            _ => None,
        };
        issued.map_or_else(|| TokenKey::Other(token.clone()), TokenKey::Issued)
    }
}

impl TokenKey {
    fn token(&self) -> NodeId {
        match self {
            TokenKey::Issued(b) => NodeId::opaque(0, b.to_vec()),
            TokenKey::Other(n) => n.clone(),
        }
    }
}

/// The table's key of an authentication token, kept by a resolved
/// request (an issued token is inline: no allocation per request).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct SessionKey(TokenKey);

impl SessionKey {
    /// The key of `token`.
    pub fn of(token: &NodeId) -> Self {
        SessionKey(TokenKey::of(token))
    }
}

/// The activated session a request was resolved to (by the dispatcher,
/// once, from the authentication token and the channel).
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRef {
    /// The session's public SessionId.
    pub session_id: uascale_types::NodeId,
    /// The table key of its authentication token.
    pub key: SessionKey,
}

/// Heap entries own a copy of the key; order does not depend on it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HeapKey(TokenKey);

impl PartialOrd for HeapKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for HeapKey {
    fn cmp(&self, _other: &Self) -> std::cmp::Ordering {
        std::cmp::Ordering::Equal
    }
}

/// Why a session lookup failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SessionError {
    /// No session with that token (`BadSessionIdInvalid`).
    Unknown,
    /// Created but not activated (`BadSessionNotActivated`).
    NotActivated,
    /// Bound to another secure channel (`BadSecureChannelIdInvalid`).
    OtherChannel,
    /// The server holds `max_session_count` sessions (`BadTooManySessions`).
    TooMany,
    /// The nonce an ActivateSession was signed over was already consumed
    /// by another ActivateSession (`BadNonceInvalid`).
    NonceConsumed,
}

impl SessionError {
    /// The StatusCode for the ServiceFault.
    pub fn status_code(self) -> StatusCode {
        match self {
            SessionError::Unknown => StatusCode::BadSessionIdInvalid,
            SessionError::NotActivated => StatusCode::BadSessionNotActivated,
            SessionError::OtherChannel => StatusCode::BadSecureChannelIdInvalid,
            SessionError::TooMany => StatusCode::BadTooManySessions,
            SessionError::NonceConsumed => StatusCode::BadNonceInvalid,
        }
    }
}

/// A transition of a session's life, told to every [`SessionListener`]
/// after the table changed (no table lock is held while listeners run).
///
/// ```text
///  CreateSession          ActivateSession            CloseSession
/// -------------> Created ----------------> Activated -------------> Closed
///                   |                       |  ^  |
///                   | activation deadline   |  |  | ActivateSession on
///                   v                       |  |  | another channel
///               TimedOut (orphan)           |  +--+ Moved
///                                           | timeout without requests
///                                           v
///                                        TimedOut
/// ```
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum SessionEvent {
    /// CreateSession made it on `channel_id`; not activated yet.
    Created {
        /// The public SessionId.
        session_id: NodeId,
        /// The channel it was created on.
        channel_id: u32,
    },
    /// Its first ActivateSession succeeded on `channel_id`.
    Activated {
        /// The public SessionId.
        session_id: NodeId,
        /// The channel it is now bound to.
        channel_id: u32,
    },
    /// An activated session was activated again on the same channel (a
    /// new nonce, perhaps another user).
    Reactivated {
        /// The public SessionId.
        session_id: NodeId,
        /// Its channel.
        channel_id: u32,
    },
    /// An activated session was activated on another channel (a client
    /// reconnecting, or a takeover after a failover).
    Moved {
        /// The public SessionId.
        session_id: NodeId,
        /// The channel it left.
        from: u32,
        /// The channel it is now bound to.
        to: u32,
    },
    /// It was taken over from another cluster node: restored from the
    /// cluster store, already activated, bound to no channel yet (the
    /// ActivateSession that follows moves it to its channel).
    Restored {
        /// The public SessionId.
        session_id: NodeId,
    },
    /// Browse or BrowseNext made, used up or released continuation
    /// points of it: what a cluster mirror copies with the session (the
    /// other listeners have nothing to do with it).
    ContinuationPointsChanged {
        /// The public SessionId.
        session_id: NodeId,
    },
    /// CloseSession removed it.
    Closed {
        /// The public SessionId.
        session_id: NodeId,
        /// The channel it was bound to.
        channel_id: u32,
        /// Whether it had been activated.
        activated: bool,
        /// Whether the client asked to delete its subscriptions.
        delete_subscriptions: bool,
    },
    /// It was closed by the server: no request within its timeout, or (when
    /// `activated` is false) no ActivateSession before the activation
    /// deadline - an orphan.
    TimedOut {
        /// The public SessionId.
        session_id: NodeId,
        /// The channel it was bound to.
        channel_id: u32,
        /// Whether it had been activated.
        activated: bool,
    },
}

/// Hears every [`SessionEvent`] (the connection's budget headroom,
/// subscriptions, audit, metrics, a cluster mirror). Called on the task
/// that made the transition: keep it short and never block.
pub type SessionListener = std::sync::Arc<dyn Fn(&SessionEvent) + Send + Sync>;

/// Hears every transition with the session's authentication token and
/// the session as it is after it (`None` once it is gone): what a cluster
/// mirror writes to its store. Set once ([`SessionTable::set_mirror`]);
/// without one no session is copied. Called with no table lock held.
pub type SessionMirror =
    std::sync::Arc<dyn Fn(&SessionEvent, &NodeId, Option<&Session>) + Send + Sync>;

/// What a successful ActivateSession sets on the session.
#[derive(Debug, Clone)]
pub struct Activation {
    /// The nonce the client's signatures covered: the activation fails
    /// with [`SessionError::NonceConsumed`] when another ActivateSession
    /// consumed it first.
    pub expected_nonce: [u8; 32],
    /// The next nonce sent to the client.
    pub next_nonce: [u8; 32],
    /// The channel the request came on (the session moves to it).
    pub channel_id: u32,
    /// That channel's security policy.
    pub security_policy: uascale_crypto::policy::SecurityPolicy,
    /// That channel's security mode.
    pub security_mode: uascale_types::MessageSecurityMode,
    /// The locale ids the client asked for.
    pub locale_ids: Vec<UaString>,
    /// Who the session now acts for.
    pub user: crate::identity::UserIdentity,
    /// ECC: the session's new ECC state (a new ECDHKey); None keeps it.
    pub ecc: Option<std::sync::Arc<EccSession>>,
}

/// A place for one more session, taken before any expensive work is done
/// for it (docs/scalability.md §2: limits are checked before RSA work); it is
/// given back when dropped unless [`SessionTable::create`] used it.
#[derive(Debug)]
pub struct SessionSlot<'a> {
    table: &'a SessionTable,
    used: bool,
}

impl Drop for SessionSlot<'_> {
    fn drop(&mut self) {
        if !self.used {
            self.table.count.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// Every session of the server.
pub struct SessionTable {
    shards: Vec<Mutex<Shard>>,
    count: AtomicUsize,
    max: usize,
    seq: AtomicUsize,
    expired: AtomicUsize,
    cumulated: AtomicUsize,
    rejected: AtomicUsize,
    security_rejected: AtomicUsize,
    orphaned: AtomicUsize,
    /// Who hears of each transition (see [`SessionEvent`]).
    listeners: std::sync::RwLock<Vec<SessionListener>>,
    /// The cluster mirror, when this server is a cluster node.
    mirror: std::sync::OnceLock<SessionMirror>,
    /// The last SessionDiagnosticsArray and when it was built.
    diagnostics: Mutex<Option<(Instant, Variant)>>,
    /// The same for the SessionSecurityDiagnosticsArray.
    security_diagnostics: Mutex<Option<(Instant, Variant)>>,
}

impl std::fmt::Debug for SessionTable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionTable")
            .field("sessions", &self.len())
            .field("max", &self.max)
            .finish_non_exhaustive()
    }
}

fn shard_of(token: &TokenKey) -> usize {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    token.hash(&mut h);
    (h.finish() as usize) % SHARDS
}

impl SessionTable {
    /// A table holding at most `max` sessions.
    pub fn new(max: usize) -> Self {
        SessionTable {
            shards: (0..SHARDS).map(|_| Mutex::new(Shard::default())).collect(),
            count: AtomicUsize::new(0),
            max,
            seq: AtomicUsize::new(0),
            expired: AtomicUsize::new(0),
            cumulated: AtomicUsize::new(0),
            rejected: AtomicUsize::new(0),
            security_rejected: AtomicUsize::new(0),
            orphaned: AtomicUsize::new(0),
            listeners: std::sync::RwLock::new(Vec::new()),
            mirror: std::sync::OnceLock::new(),
            diagnostics: Mutex::new(None),
            security_diagnostics: Mutex::new(None),
        }
    }

    fn shard(&self, token: &TokenKey) -> std::sync::MutexGuard<'_, Shard> {
        // A panic while holding a shard lock cannot leave a session half
        // written (every update is one insert or field store), so a
        // poisoned lock is still usable.
        match self.shards[shard_of(token)].lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Sessions open now.
    pub fn len(&self) -> usize {
        self.count.load(Ordering::Relaxed)
    }

    /// True when there are none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Sessions closed by timeout or missed activation so far.
    pub fn expired_count(&self) -> usize {
        self.expired.load(Ordering::Relaxed)
    }

    /// Sessions created since the server started.
    pub fn cumulated_count(&self) -> usize {
        self.cumulated.load(Ordering::Relaxed)
    }

    /// CreateSession and ActivateSession requests rejected so far.
    pub fn rejected_count(&self) -> usize {
        self.rejected.load(Ordering::Relaxed)
    }

    /// The part of [`rejected_count`](Self::rejected_count) rejected for
    /// security reasons (certificate, signature, identity, access).
    pub fn security_rejected_count(&self) -> usize {
        self.security_rejected.load(Ordering::Relaxed)
    }

    /// Counts a rejected CreateSession or ActivateSession (`security` when
    /// the reason was a security check). Two relaxed atomic adds.
    pub fn note_rejected(&self, security: bool) {
        self.rejected.fetch_add(1, Ordering::Relaxed);
        if security {
            self.security_rejected.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Sessions that missed their activation deadline (orphans) so far;
    /// a part of [`expired_count`](Self::expired_count).
    pub fn orphaned_count(&self) -> usize {
        self.orphaned.load(Ordering::Relaxed)
    }

    /// Sessions created and not activated (yet). Walks every shard: for
    /// diagnostics and tests, not for a request path.
    pub fn unactivated_count(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let g = s.lock().unwrap_or_else(|p| p.into_inner());
                g.sessions.values().filter(|s| !s.activated).count()
            })
            .sum()
    }

    /// Adds `listener`: it hears every later transition.
    pub fn listen(&self, listener: SessionListener) {
        self.listeners
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(listener);
    }

    fn emit(&self, event: SessionEvent) {
        let listeners = self.listeners.read().unwrap_or_else(|p| p.into_inner());
        for l in listeners.iter() {
            l(&event);
        }
    }

    /// Sets the cluster mirror (once; false when one was set already).
    pub fn set_mirror(&self, mirror: SessionMirror) -> bool {
        self.mirror.set(mirror).is_ok()
    }

    /// Tells the mirror, if there is one.
    fn mirrored(&self, event: &SessionEvent, token: &NodeId, session: Option<&Session>) {
        if let Some(m) = self.mirror.get() {
            m(event, token, session);
        }
    }

    /// Puts `session`, taken over from another cluster node, under
    /// `token` (the transition [`SessionEvent::Restored`]; the mirror is
    /// not told: the claim writes the record). `TooMany` when the table is full; false when a session
    /// with that token is here already (it is left as it is).
    pub fn restore(&self, token: &NodeId, session: Session) -> Result<bool, SessionError> {
        let slot = self.reserve()?;
        let key = TokenKey::of(token);
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) as u64;
        let mut shard = self.shard(&key);
        if shard.sessions.contains_key(&key) {
            return Ok(false);
        }
        let mut slot = slot;
        slot.used = true;
        shard
            .deadlines
            .push(Reverse((session.deadline, seq, HeapKey(key.clone()))));
        let event = SessionEvent::Restored {
            session_id: session.session_id.clone(),
        };
        shard.sessions.insert(key, Box::new(session));
        drop(shard);
        self.emit(event);
        Ok(true)
    }

    /// Removes the session of `token` because another cluster node owns
    /// it now: the listeners hear it closed (its subscriptions go with
    /// it), the mirror does not (the record is the new owner's).
    pub fn evict(&self, token: &NodeId) -> Option<Session> {
        let key = TokenKey::of(token);
        let s = self.shard(&key).sessions.remove(&key)?;
        self.count.fetch_sub(1, Ordering::AcqRel);
        self.emit(SessionEvent::Closed {
            session_id: s.session_id.clone(),
            channel_id: s.channel_id,
            activated: s.activated,
            delete_subscriptions: true,
        });
        Some(*s)
    }

    /// Takes a place for one more session: `TooMany` when the table holds
    /// `max_session_count` (counting places taken and not yet used).
    pub fn reserve(&self) -> Result<SessionSlot<'_>, SessionError> {
        self.count
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .map_err(|_| SessionError::TooMany)?;
        Ok(SessionSlot {
            table: self,
            used: false,
        })
    }

    /// Adds a session under `token` in the place `slot` (the transition
    /// [`SessionEvent::Created`]).
    pub fn create(&self, mut slot: SessionSlot<'_>, token: NodeId, session: Session) {
        slot.used = true;
        self.cumulated.fetch_add(1, Ordering::Relaxed);
        let seq = self.seq.fetch_add(1, Ordering::Relaxed) as u64;
        let key = TokenKey::of(&token);
        let event = SessionEvent::Created {
            session_id: session.session_id.clone(),
            channel_id: session.channel_id,
        };
        let copy = self.mirror.get().map(|_| session.mirror_copy());
        {
            let mut shard = self.shard(&key);
            shard
                .deadlines
                .push(Reverse((session.deadline, seq, HeapKey(key.clone()))));
            if shard.sessions.insert(key, Box::new(session)).is_some() {
                // Tokens are random; a duplicate replaces, so the count must not grow.
                self.count.fetch_sub(1, Ordering::AcqRel);
            }
        }
        if let Some(copy) = copy {
            self.mirrored(&event, &token, Some(&copy));
        }
        self.emit(event);
    }

    /// Reserves and creates in one step, unless the table is full.
    pub fn insert(&self, token: NodeId, session: Session) -> Result<(), SessionError> {
        let slot = self.reserve()?;
        self.create(slot, token, session);
        Ok(())
    }

    /// Activates the session of `token` (the transitions
    /// [`SessionEvent::Activated`], [`SessionEvent::Reactivated`] and
    /// [`SessionEvent::Moved`]): binds it to the request's channel, moves
    /// its deadline to `now` + its timeout and sets what `a` carries - if
    /// its nonce is still `a.expected_nonce`.
    pub fn activate(
        &self,
        token: &NodeId,
        a: Activation,
        now: Instant,
    ) -> Result<(), SessionError> {
        let key = TokenKey::of(token);
        let event = {
            let mut shard = self.shard(&key);
            let s = shard.sessions.get_mut(&key).ok_or(SessionError::Unknown)?;
            if s.server_nonce != a.expected_nonce {
                return Err(SessionError::NonceConsumed);
            }
            let event = match (s.activated, s.channel_id == a.channel_id) {
                (false, _) => SessionEvent::Activated {
                    session_id: s.session_id.clone(),
                    channel_id: a.channel_id,
                },
                (true, true) => SessionEvent::Reactivated {
                    session_id: s.session_id.clone(),
                    channel_id: a.channel_id,
                },
                (true, false) => SessionEvent::Moved {
                    session_id: s.session_id.clone(),
                    from: s.channel_id,
                    to: a.channel_id,
                },
            };
            s.channel_id = a.channel_id;
            s.security_policy = a.security_policy;
            s.security_mode = a.security_mode;
            s.activated = true;
            s.deadline = now + s.timeout;
            s.locale_ids = a.locale_ids.into();
            s.server_nonce = a.next_nonce;
            s.user = a.user;
            if let Some(ecc) = a.ecc {
                s.ecc = Some(ecc);
            }
            (event, self.mirror.get().map(|_| s.mirror_copy()))
        };
        let (event, copy) = event;
        if let Some(copy) = copy {
            self.mirrored(&event, token, Some(&copy));
        }
        self.emit(event);
        Ok(())
    }

    /// Runs `f` on the session of `token` if it is bound to `channel_id`
    /// (or on any channel when `channel_id` is `None`) and, when
    /// `need_activated`, activated. Touching it moves its deadline.
    pub fn with<R>(
        &self,
        token: &NodeId,
        channel_id: Option<u32>,
        need_activated: bool,
        now: Instant,
        f: impl FnOnce(&mut Session) -> R,
    ) -> Result<R, SessionError> {
        self.with_key_checked(&SessionKey::of(token), channel_id, need_activated, now, f)
    }

    fn with_key_checked<R>(
        &self,
        key: &SessionKey,
        channel_id: Option<u32>,
        need_activated: bool,
        now: Instant,
        f: impl FnOnce(&mut Session) -> R,
    ) -> Result<R, SessionError> {
        let key = &key.0;
        let mut shard = self.shard(key);
        let s = shard.sessions.get_mut(key).ok_or(SessionError::Unknown)?;
        if channel_id.is_some_and(|c| c != s.channel_id) {
            return Err(SessionError::OtherChannel);
        }
        if need_activated && !s.activated {
            return Err(SessionError::NotActivated);
        }
        if s.activated {
            s.deadline = now + s.timeout;
        }
        Ok(f(s))
    }

    /// Resolves a request's session: the activated session of `token`
    /// bound to `channel_id` (its deadline moves: the request counts as
    /// activity).
    pub fn resolve(
        &self,
        token: &NodeId,
        channel_id: u32,
        now: Instant,
    ) -> Result<SessionRef, SessionError> {
        let key = SessionKey::of(token);
        let session_id =
            self.with_key_checked(&key, Some(channel_id), true, now, |s| s.session_id.clone())?;
        Ok(SessionRef { session_id, key })
    }

    /// Runs `f` on the session of an already resolved key (`Unknown` when
    /// it closed since).
    pub fn with_key<R>(
        &self,
        key: &SessionKey,
        f: impl FnOnce(&mut Session) -> R,
    ) -> Result<R, SessionError> {
        let mut shard = self.shard(&key.0);
        let s = shard
            .sessions
            .get_mut(&key.0)
            .ok_or(SessionError::Unknown)?;
        Ok(f(s))
    }

    /// Tells the listeners and the mirror that the session of `key` made,
    /// used up or released Browse continuation points (the transition
    /// [`SessionEvent::ContinuationPointsChanged`]): a cluster mirror
    /// copies them with the session. Nothing when the session is gone.
    pub fn continuation_points_changed(&self, key: &SessionKey) {
        let heard = {
            let shard = self.shard(&key.0);
            shard.sessions.get(&key.0).map(|s| {
                (
                    SessionEvent::ContinuationPointsChanged {
                        session_id: s.session_id.clone(),
                    },
                    self.mirror.get().map(|_| s.mirror_copy()),
                )
            })
        };
        let Some((event, copy)) = heard else {
            return;
        };
        if let Some(copy) = copy {
            self.mirrored(&event, &key.0.token(), Some(&copy));
        }
        self.emit(event);
    }

    /// Removes the session of `token` (the transition
    /// [`SessionEvent::Closed`]; `delete_subscriptions` is the client's
    /// wish, passed on to the listeners).
    pub fn close(&self, token: &NodeId, delete_subscriptions: bool) -> Option<Session> {
        let key = TokenKey::of(token);
        let s = self.shard(&key).sessions.remove(&key)?;
        self.count.fetch_sub(1, Ordering::AcqRel);
        let event = SessionEvent::Closed {
            session_id: s.session_id.clone(),
            channel_id: s.channel_id,
            activated: s.activated,
            delete_subscriptions,
        };
        self.mirrored(&event, token, None);
        self.emit(event);
        Some(*s)
    }

    /// Closes every session whose deadline has passed (the transition
    /// [`SessionEvent::TimedOut`]); returns their ids. Each shard pops only
    /// due heap entries, so the cost is proportional to what is due, not to
    /// the session count.
    pub fn expire(&self, now: Instant) -> Vec<NodeId> {
        let mut gone = Vec::new();
        let mut events = Vec::new();
        for shard in &self.shards {
            let mut shard = match shard.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            while let Some(Reverse((due, _, _))) = shard.deadlines.peek() {
                if *due > now {
                    break;
                }
                let Some(Reverse((_, _, HeapKey(token)))) = shard.deadlines.pop() else {
                    break;
                };
                let deadline = shard.sessions.get(&token).map(|s| s.deadline);
                match deadline {
                    None => {}
                    Some(d) if d <= now => {
                        if let Some(s) = shard.sessions.remove(&token) {
                            self.count.fetch_sub(1, Ordering::AcqRel);
                            self.expired.fetch_add(1, Ordering::Relaxed);
                            if !s.activated {
                                self.orphaned.fetch_add(1, Ordering::Relaxed);
                            }
                            events.push((
                                SessionEvent::TimedOut {
                                    session_id: s.session_id.clone(),
                                    channel_id: s.channel_id,
                                    activated: s.activated,
                                },
                                self.mirror.get().map(|_| token.token()),
                            ));
                            gone.push(s.session_id);
                        }
                    }
                    Some(d) => {
                        let seq = self.seq.fetch_add(1, Ordering::Relaxed) as u64;
                        shard.deadlines.push(Reverse((d, seq, HeapKey(token))));
                    }
                }
            }
        }
        for (e, token) in events {
            if let Some(token) = token {
                self.mirrored(&e, &token, None);
            }
            self.emit(e);
        }
        gone
    }

    /// The SessionDiagnosticsArray: rebuilt when asked for, at most once a
    /// second (docs/scalability.md §5), walking every shard; nothing in session
    /// establishment touches it. `now`/`instant` are the same moment on the
    /// wall and monotonic clocks; `per_session` gives a session's
    /// subscription and monitored-item counts (called with no shard lock
    /// held). Request counters are not kept per session and read 0.
    pub fn diagnostics(
        &self,
        now: DateTime,
        instant: Instant,
        server_uri: &str,
        max_response_message_size: u32,
        per_session: impl Fn(&NodeId) -> (usize, usize),
    ) -> Variant {
        let mut cache = match self.diagnostics.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if let Some((built, v)) = cache.as_ref() {
            if instant.saturating_duration_since(*built) < Duration::from_secs(1) {
                return v.clone();
            }
        }
        // Wall-clock time of a monotonic instant in the past.
        let wall = |t: Instant| {
            let ago = instant.saturating_duration_since(t).as_micros();
            DateTime::from_ticks(
                now.ticks()
                    .saturating_sub(i64::try_from(ago.saturating_mul(10)).unwrap_or(i64::MAX)),
            )
        };
        let mut rows: Vec<SessionDiagnosticsDataType> = Vec::new();
        for shard in &self.shards {
            let g = match shard.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            rows.extend(g.sessions.values().map(|s| SessionDiagnosticsDataType {
                session_id: s.session_id.clone(),
                session_name: s.name.clone(),
                client_description: uascale_types::ApplicationDescription {
                    application_uri: s.client_uri.clone(),
                    application_type: uascale_types::ApplicationType::Client,
                    ..Default::default()
                },
                server_uri: UaString::from(server_uri),
                endpoint_url: s.endpoint_url.clone(),
                locale_ids: Some(s.locale_ids.to_vec()),
                actual_session_timeout: s.timeout.as_secs_f64() * 1000.0,
                max_response_message_size,
                client_connection_time: s.created,
                // An activated session's deadline is its last request plus
                // its timeout; before activation the last contact is the
                // creation.
                client_last_contact_time: if s.activated {
                    wall(s.deadline.checked_sub(s.timeout).unwrap_or(instant))
                } else {
                    s.created
                },
                ..Default::default()
            }));
        }
        let n = |x: usize| u32::try_from(x).unwrap_or(u32::MAX);
        let rows = rows
            .into_iter()
            .map(|mut r| {
                let (subs, items) = per_session(&r.session_id);
                r.current_subscriptions_count = n(subs);
                r.current_monitored_items_count = n(items);
                ExtensionObject::new(r)
            })
            .collect();
        // An empty array stays a (typed) array, not a null value.
        let v = Variant::from(uascale_types::Array::new(
            uascale_types::ArrayValues::ExtensionObject(rows),
        ));
        *cache = Some((instant, v.clone()));
        v
    }

    /// The SessionSecurityDiagnosticsArray, throttled like
    /// [`diagnostics`](Self::diagnostics). The session keeps the user it was
    /// activated for and its channel's policy and mode, not the client
    /// certificate (only its thumbprint) nor earlier users: ClientCertificate
    /// is null and ClientUserIdHistory holds the current user only.
    pub fn security_diagnostics(&self, instant: Instant) -> Variant {
        let mut cache = match self.security_diagnostics.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        if let Some((built, v)) = cache.as_ref() {
            if instant.saturating_duration_since(*built) < Duration::from_secs(1) {
                return v.clone();
            }
        }
        let mut rows = Vec::new();
        for shard in &self.shards {
            let g = match shard.lock() {
                Ok(g) => g,
                Err(p) => p.into_inner(),
            };
            rows.extend(g.sessions.values().map(|s| {
                let user = UaString::from(s.user.client_user_id().as_str());
                let mechanism = match s.user {
                    crate::identity::UserIdentity::Anonymous => "Anonymous",
                    crate::identity::UserIdentity::UserName(_) => "UserName",
                    crate::identity::UserIdentity::X509(_) => "X509Certificate",
                };
                ExtensionObject::new(uascale_types::SessionSecurityDiagnosticsDataType {
                    session_id: s.session_id.clone(),
                    client_user_id_of_session: user.clone(),
                    client_user_id_history: Some(vec![user]),
                    authentication_mechanism: UaString::from(mechanism),
                    encoding: UaString::from("UA Binary"),
                    transport_protocol: UaString::from("opc.tcp"),
                    security_mode: s.security_mode,
                    security_policy_uri: UaString::from(s.security_policy.uri()),
                    client_certificate: ByteString::null(),
                })
            }));
        }
        let v = Variant::from(uascale_types::Array::new(
            uascale_types::ArrayValues::ExtensionObject(rows),
        ));
        *cache = Some((instant, v.clone()));
        v
    }

    /// The earliest deadline in the table, if any (for the reaper's sleep).
    pub fn next_deadline(&self) -> Option<Instant> {
        self.shards
            .iter()
            .filter_map(|s| {
                let g = match s.lock() {
                    Ok(g) => g,
                    Err(p) => p.into_inner(),
                };
                g.deadlines.peek().map(|Reverse((d, _, _))| *d)
            })
            .min()
    }
}

#[cfg(test)]
// Tests take one real instant as the origin of their simulated time.
#[allow(clippy::disallowed_methods)]
mod tests {
    use super::*;

    /// Every session holds one `Session` (boxed in the table), so its
    /// size is memory per session: what most sessions never
    /// use (locales, Browse continuation points, an X509 user) is kept
    /// behind a pointer.
    #[test]
    fn a_session_stays_small() {
        // glibc gives a 272-byte struct a 288-byte chunk (320: 336).
        assert!(
            std::mem::size_of::<Session>() <= 272,
            "Session is {} bytes",
            std::mem::size_of::<Session>()
        );
        assert!(std::mem::size_of::<crate::identity::UserIdentity>() <= 24);
    }

    fn session(now: Instant, deadline: Duration) -> Session {
        Session {
            session_id: NodeId::ns0(1),
            channel_id: 7,
            timeout: Duration::from_secs(30),
            deadline: now + deadline,
            activated: false,
            name: UaString::null(),
            locale_ids: Box::default(),
            continuation_points: None,
            server_nonce: [0; 32],
            client_thumbprint: None,
            client_uri: UaString::null(),
            user: crate::identity::UserIdentity::Anonymous,
            created: DateTime::MIN,
            endpoint_url: UaString::null(),
            security_policy: uascale_crypto::policy::SecurityPolicy::None,
            ecc: None,
            security_mode: uascale_types::MessageSecurityMode::None,
        }
    }

    /// Issued-size tokens are keyed inline, others as NodeIds; a token of
    /// the same bytes in another namespace or of another identifier type
    /// is a different session.
    #[test]
    fn tokens_of_every_shape_are_told_apart() {
        let t = Instant::now();
        let table = SessionTable::new(10);
        let tokens = [
            NodeId::opaque(0, vec![3; 32]),
            NodeId::opaque(1, vec![3; 32]),
            NodeId::opaque(0, vec![3; 31]),
            NodeId::string(0, "token"),
            NodeId::numeric(0, 3),
        ];
        for (i, token) in tokens.iter().enumerate() {
            let mut s = session(t, Duration::from_secs(5));
            s.channel_id = i as u32;
            table.insert(token.clone(), s).unwrap();
        }
        assert_eq!(table.len(), tokens.len());
        for (i, token) in tokens.iter().enumerate() {
            assert_eq!(
                table.with(token, None, false, t, |s| s.channel_id),
                Ok(i as u32)
            );
        }
        assert_eq!(
            table.with(&NodeId::opaque(0, vec![4; 32]), None, false, t, |_| ()),
            Err(SessionError::Unknown)
        );
        // Expiry finds them through the heap's copies of the keys.
        assert_eq!(
            table.expire(t + Duration::from_secs(60)).len(),
            tokens.len()
        );
        assert!(table.is_empty());
    }

    #[test]
    fn lookup_rules() {
        let t = Instant::now();
        let table = SessionTable::new(10);
        let token = NodeId::opaque(0, vec![1; 32]);
        table
            .insert(token.clone(), session(t, Duration::from_secs(5)))
            .unwrap();
        assert_eq!(
            table.with(&token, Some(7), true, t, |_| ()),
            Err(SessionError::NotActivated)
        );
        assert_eq!(
            table.with(&token, Some(8), false, t, |_| ()),
            Err(SessionError::OtherChannel)
        );
        table
            .with(&token, Some(7), false, t, |s| s.activated = true)
            .unwrap();
        assert!(table.with(&token, Some(7), true, t, |_| ()).is_ok());
        assert_eq!(
            table.with(&NodeId::opaque(0, vec![2; 32]), None, false, t, |_| ()),
            Err(SessionError::Unknown)
        );
        assert!(table.close(&token, true).is_some());
        assert!(table.is_empty());
    }

    #[test]
    fn max_session_count() {
        let t = Instant::now();
        let table = SessionTable::new(2);
        for i in 0..2u8 {
            table
                .insert(
                    NodeId::opaque(0, vec![i]),
                    session(t, Duration::from_secs(5)),
                )
                .unwrap();
        }
        assert_eq!(
            table.insert(
                NodeId::opaque(0, vec![9]),
                session(t, Duration::from_secs(5))
            ),
            Err(SessionError::TooMany)
        );
        assert_eq!(
            SessionError::TooMany.status_code(),
            StatusCode::BadTooManySessions
        );
    }

    #[test]
    fn expiry_is_lazy_and_respects_activity() {
        let t = Instant::now();
        let table = SessionTable::new(100);
        let a = NodeId::opaque(0, vec![1]);
        let b = NodeId::opaque(0, vec![2]);
        table
            .insert(a.clone(), session(t, Duration::from_secs(5)))
            .unwrap();
        table
            .insert(b.clone(), session(t, Duration::from_secs(5)))
            .unwrap();
        // b is activated and used at t+4: its deadline moves to t+34.
        table
            .with(&b, None, false, t + Duration::from_secs(4), |s| {
                s.activated = true;
            })
            .unwrap();
        table
            .with(&b, None, true, t + Duration::from_secs(4), |_| ())
            .unwrap();
        assert!(table.expire(t + Duration::from_secs(4)).is_empty());
        // a missed its activation deadline; b is still alive.
        assert_eq!(table.expire(t + Duration::from_secs(5)).len(), 1);
        assert_eq!(table.len(), 1);
        assert_eq!(table.next_deadline(), Some(t + Duration::from_secs(34)));
        assert_eq!(table.expire(t + Duration::from_secs(34)).len(), 1);
        assert_eq!(table.expired_count(), 2);
        assert!(table.is_empty());
    }
}
