//! The records a node writes to the store, in the OPC UA binary encoding
//! (the codec the server already trusts for bounded decoding): a tag, a
//! format number, the owner and the record's version, then the fields.
//! A record the store hands back is decoded with small limits, and
//! anything wrong in it is a [`RecordError`], never a panic.

use std::time::Duration;

use uascale_crypto::ecc::EccCurve;
use uascale_crypto::policy::SecurityPolicy;
use uascale_types::{
    BinaryDecode, BinaryEncode, ByteString, DateTime, DecodeError, DecodeLimits,
    MessageSecurityMode, NodeId, Reader, UaString,
};

use crate::identity::UserIdentity;
use crate::subscription::{ItemImage, SubscriptionImage};

/// The first bytes of a session record.
const SESSION_TAG: &[u8; 4] = b"UASs";
/// The first bytes of a node (heartbeat) record.
const NODE_TAG: &[u8; 4] = b"UASn";
/// The first bytes of a node's status record.
const STATUS_TAG: &[u8; 4] = b"UASt";
/// The record layout this code writes and reads.
const FORMAT: u8 = 1;
/// The session record layout with the ECC state appended; written only for
/// sessions that have it, so the records of other sessions stay readable by
/// nodes that know format 1 only.
const FORMAT_ECC: u8 = 2;
/// The subscriptions record layout whose items carry an EventFilter (a
/// flag and the filter after each item); written only for sessions with
/// an event item, so the other records stay readable by nodes that know
/// format 1 only.
const FORMAT_EVENTS: u8 = 2;

/// The subscriptions record layout whose items carry, after the event
/// filter, the values a draining node had not yet published (the last
/// value that passed the filter, and the queued ones). Written only in
/// the final records of a drain, only for sessions with such values, and
/// only once every live node reads it ([`READS`]): the other records stay
/// formats 1 and 2.
pub const FORMAT_QUEUES: u8 = 4;

/// The subscriptions record layout whose event items carry, after their
/// unsent values (none for an event item), the events a draining node had
/// queued and not yet published. Written only in the final records of a
/// drain, only for sessions with such events, and only once every live
/// node reads it ([`READS`]); else a drain writes format 4 without them.
pub const FORMAT_EVENT_QUEUES: u8 = 5;

/// The session record layout with the session's Browse continuation
/// points appended (after a flag and, when set, the ECC state). Written
/// only for sessions that hold continuation points, and only once every
/// live node reads it ([`READS`] in its status record): the records of
/// other sessions stay formats 1 and 2.
pub const FORMAT_CONTINUATION: u8 = 3;

/// The newest record format of any kind this build reads, told to the
/// other nodes in its status record ([`StatusRecord::reads`]).
pub const READS: u8 = FORMAT_EVENT_QUEUES;

/// The most bytes the continuation points of one session record may
/// take; points beyond are not mirrored (a point of a numeric node takes
/// about 50, so the default 10 points per session take about 500).
pub const MAX_CONTINUATION_BYTES: usize = 8 * 1024;

/// The most continuation points a record may hold (the configuration's
/// limit per session is a u16).
const MAX_CONTINUATION_POINTS: u32 = u16::MAX as u32;

/// The longest continuation point id a record may hold (this server's
/// are 16 bytes).
const MAX_CONTINUATION_ID: usize = 64;

/// Why a record from the store was refused.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum RecordError {
    /// It does not start with the tag of the expected record kind.
    WrongKind,
    /// A layout this version does not read.
    Format(u8),
    /// Its fields did not decode.
    Decode(String),
    /// A field decoded to a value that cannot be (named).
    Field(&'static str),
}

impl std::fmt::Display for RecordError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RecordError::WrongKind => f.write_str("not a record of the expected kind"),
            RecordError::Format(v) => write!(f, "record format {v} is not known"),
            RecordError::Decode(e) => write!(f, "record does not decode: {e}"),
            RecordError::Field(name) => write!(f, "record field {name} is invalid"),
        }
    }
}

impl std::error::Error for RecordError {}

impl From<DecodeError> for RecordError {
    fn from(e: DecodeError) -> Self {
        RecordError::Decode(e.to_string())
    }
}

fn limits() -> DecodeLimits {
    DecodeLimits {
        max_string_length: 4096,
        max_byte_string_length: 16 * 1024,
        max_array_length: 256,
        max_message_size: super::store::MAX_RECORD_BYTES,
        ..DecodeLimits::default()
    }
}

fn header(w: &mut Vec<u8>, tag: &[u8; 4], owner: &str, version: u64) {
    header_of(w, tag, FORMAT, owner, version);
}

fn header_of(w: &mut Vec<u8>, tag: &[u8; 4], format: u8, owner: &str, version: u64) {
    w.extend_from_slice(tag);
    w.push(format);
    UaString::from(owner).encode(w);
    version.encode(w);
}

fn read_header(r: &mut Reader<'_>, tag: &[u8; 4]) -> Result<(String, u64), RecordError> {
    read_header_of(r, tag, FORMAT).map(|(owner, version, _)| (owner, version))
}

/// The header of a record whose layouts are 1 to `newest`: owner, version
/// and the layout.
fn read_header_of(
    r: &mut Reader<'_>,
    tag: &[u8; 4],
    newest: u8,
) -> Result<(String, u64, u8), RecordError> {
    if r.take(4).map_err(|_| RecordError::WrongKind)? != tag {
        return Err(RecordError::WrongKind);
    }
    let format = u8::decode(r)?;
    if !(FORMAT..=newest).contains(&format) {
        return Err(RecordError::Format(format));
    }
    let owner = UaString::decode(r)?
        .as_str()
        .filter(|s| !s.is_empty())
        .ok_or(RecordError::Field("owner"))?
        .to_owned();
    Ok((owner, u64::decode(r)?, format))
}

fn fixed<const N: usize>(b: &ByteString, name: &'static str) -> Result<[u8; N], RecordError> {
    b.as_bytes()
        .and_then(|b| <[u8; N]>::try_from(b).ok())
        .ok_or(RecordError::Field(name))
}

/// A session as the cluster mirrors it: what another node needs to take
/// it over when its client comes back (the authentication token and the
/// current server nonce, the client certificate's thumbprint, the user,
/// the channel's policy and mode, the endpoint, the timeout, the locales).
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRecord {
    /// The node that serves the session now.
    pub owner: String,
    /// Bumped by every write of the record.
    pub version: u64,
    /// The public SessionId.
    pub session_id: NodeId,
    /// The authentication token (the record's key is made from it).
    pub token: NodeId,
    /// The nonce the next ActivateSession must be signed over; consumed
    /// once, cluster-wide, by the compare-and-set that claims the session.
    pub server_nonce: [u8; 32],
    /// The thumbprint of the client certificate that created the session
    /// (None on SecurityPolicy None): only a channel with that
    /// certificate may take the session over.
    pub client_thumbprint: Option<[u8; 20]>,
    /// The client's ApplicationUri.
    pub client_uri: UaString,
    /// The client's session name.
    pub name: UaString,
    /// Who the session acts for.
    pub user: UserIdentity,
    /// The security policy of the channel it was last activated on.
    pub security_policy: SecurityPolicy,
    /// The security mode of that channel.
    pub security_mode: MessageSecurityMode,
    /// The EndpointUrl the client gave in CreateSession.
    pub endpoint_url: UaString,
    /// The revised session timeout.
    pub timeout: Duration,
    /// Locale ids from ActivateSession.
    pub locale_ids: Vec<UaString>,
    /// When CreateSession made it.
    pub created: DateTime,
    /// True once activated.
    pub activated: bool,
    /// On an ECC policy: what ActivateSession needs besides the nonce.
    pub ecc: Option<EccRecord>,
    /// The session's outstanding Browse continuation points (record
    /// format 3; empty in the older formats).
    pub continuation_points: Vec<ContinuationRecord>,
}

/// A Browse continuation point as the cluster mirrors it: what the node
/// that takes the session over needs to answer BrowseNext - the browse
/// (node, direction, reference type, masks), where it stopped and its
/// page size - not the references themselves (that node browses again
/// and skips the ones returned).
#[derive(Debug, Clone, PartialEq)]
pub struct ContinuationRecord {
    /// The id the client holds (1 to 64 bytes).
    pub id: Vec<u8>,
    /// The BrowseDescription of the browse it continues.
    pub browse: uascale_types::BrowseDescription,
    /// References per page (the browse's max references per node, > 0).
    pub max: u32,
    /// How many references of the browse were returned before it.
    pub returned: u32,
}

impl ContinuationRecord {
    fn encode(&self, w: &mut Vec<u8>) {
        ByteString::new(self.id.clone()).encode(w);
        self.browse.encode(w);
        self.max.encode(w);
        self.returned.encode(w);
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, RecordError> {
        let id = ByteString::decode(r)?
            .as_bytes()
            .filter(|b| !b.is_empty() && b.len() <= MAX_CONTINUATION_ID)
            .ok_or(RecordError::Field("continuation_points"))?
            .to_vec();
        let browse = uascale_types::BrowseDescription::decode(r)?;
        let max = u32::decode(r)?;
        let returned = u32::decode(r)?;
        if max == 0 {
            return Err(RecordError::Field("continuation_points"));
        }
        Ok(ContinuationRecord {
            id,
            browse,
            max,
            returned,
        })
    }

    /// The bytes it takes in a record.
    pub fn encoded_len(&self) -> usize {
        let mut w = Vec::new();
        self.encode(&mut w);
        w.len()
    }
}

/// The continuation points of `points` that a record carries: in order,
/// each one that still fits into [`MAX_CONTINUATION_BYTES`] (a point too
/// large is left out, not the ones after it).
pub fn bounded(points: impl IntoIterator<Item = ContinuationRecord>) -> Vec<ContinuationRecord> {
    let mut left = MAX_CONTINUATION_BYTES;
    points
        .into_iter()
        .filter(|p| {
            let n = p.encoded_len();
            let fits = n <= left;
            if fits {
                left -= n;
            }
            fits
        })
        .collect()
}

/// The ECC state of a session as the cluster mirrors it: the ClientNonce of
/// CreateSession (the channel-bound signatures of ActivateSession cover it)
/// and the ephemeral key whose public half was the last ECDHKey sent (a
/// UserName token's EccEncryptedSecret is encrypted for it). Its private
/// half travels in the record, as the session's nonce and token do: the
/// store is as secret as the sessions it holds.
#[derive(Clone, PartialEq)]
pub struct EccRecord {
    /// The ClientNonce.
    pub client_nonce: Vec<u8>,
    /// The curve and private bytes of the ephemeral key
    /// ([`uascale_crypto::ecc::EphemeralKey::private_bytes`]), when one was
    /// sent.
    pub ephemeral: Option<(EccCurve, Vec<u8>)>,
}

impl std::fmt::Debug for EccRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The private key stays out of logs.
        f.debug_struct("EccRecord")
            .field("client_nonce", &self.client_nonce.len())
            .field("ephemeral", &self.ephemeral.as_ref().map(|(c, _)| c))
            .finish()
    }
}

fn curve_tag(curve: EccCurve) -> u8 {
    match curve {
        EccCurve::NistP256 => 1,
        EccCurve::NistP384 => 2,
        EccCurve::Curve25519 => 3,
    }
}

fn curve_of(tag: u8) -> Result<Option<EccCurve>, RecordError> {
    match tag {
        0 => Ok(None),
        1 => Ok(Some(EccCurve::NistP256)),
        2 => Ok(Some(EccCurve::NistP384)),
        3 => Ok(Some(EccCurve::Curve25519)),
        _ => Err(RecordError::Field("ecc")),
    }
}

impl SessionRecord {
    /// The record's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(256);
        let format = if !self.continuation_points.is_empty() {
            FORMAT_CONTINUATION
        } else if self.ecc.is_some() {
            FORMAT_ECC
        } else {
            FORMAT
        };
        header_of(&mut w, SESSION_TAG, format, &self.owner, self.version);
        self.session_id.encode(&mut w);
        self.token.encode(&mut w);
        ByteString::new(self.server_nonce.to_vec()).encode(&mut w);
        self.client_thumbprint
            .map_or_else(ByteString::null, |t| ByteString::new(t.to_vec()))
            .encode(&mut w);
        self.client_uri.encode(&mut w);
        self.name.encode(&mut w);
        match &self.user {
            UserIdentity::Anonymous => 0u8.encode(&mut w),
            UserIdentity::UserName(n) => {
                1u8.encode(&mut w);
                UaString::from(n.as_str()).encode(&mut w);
            }
            UserIdentity::X509(x) => {
                2u8.encode(&mut w);
                UaString::from(x.subject.as_str()).encode(&mut w);
                ByteString::new(x.thumbprint.to_vec()).encode(&mut w);
            }
        }
        UaString::from(self.security_policy.uri()).encode(&mut w);
        self.security_mode.encode(&mut w);
        self.endpoint_url.encode(&mut w);
        u64::try_from(self.timeout.as_millis())
            .unwrap_or(u64::MAX)
            .encode(&mut w);
        Some(self.locale_ids.clone()).encode(&mut w);
        self.created.encode(&mut w);
        self.activated.encode(&mut w);
        if format == FORMAT_CONTINUATION {
            self.ecc.is_some().encode(&mut w);
        }
        if let Some(ecc) = &self.ecc {
            ByteString::new(ecc.client_nonce.clone()).encode(&mut w);
            match &ecc.ephemeral {
                None => 0u8.encode(&mut w),
                Some((curve, private)) => {
                    curve_tag(*curve).encode(&mut w);
                    ByteString::new(private.clone()).encode(&mut w);
                }
            }
        }
        if format == FORMAT_CONTINUATION {
            let points = &self.continuation_points;
            u32::try_from(points.len())
                .unwrap_or(u32::MAX)
                .encode(&mut w);
            for p in points {
                p.encode(&mut w);
            }
        }
        w
    }

    /// Decodes a record read from the store.
    pub fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        let limits = limits();
        let mut r = Reader::new(bytes, &limits)?;
        let (owner, version, format) = read_header_of(&mut r, SESSION_TAG, FORMAT_CONTINUATION)?;
        let session_id = NodeId::decode(&mut r)?;
        let token = NodeId::decode(&mut r)?;
        let server_nonce = fixed::<32>(&ByteString::decode(&mut r)?, "server_nonce")?;
        let thumb = ByteString::decode(&mut r)?;
        let client_thumbprint = match thumb.as_bytes() {
            None => None,
            Some(_) => Some(fixed::<20>(&thumb, "client_thumbprint")?),
        };
        let client_uri = UaString::decode(&mut r)?;
        let name = UaString::decode(&mut r)?;
        let text = |s: UaString| s.as_str().map(str::to_owned);
        let user = match u8::decode(&mut r)? {
            0 => UserIdentity::Anonymous,
            1 => UserIdentity::UserName(
                text(UaString::decode(&mut r)?).ok_or(RecordError::Field("user"))?,
            ),
            2 => UserIdentity::X509(Box::new(crate::identity::X509User {
                subject: text(UaString::decode(&mut r)?).ok_or(RecordError::Field("user"))?,
                thumbprint: fixed::<20>(&ByteString::decode(&mut r)?, "user")?,
            })),
            _ => return Err(RecordError::Field("user")),
        };
        let security_policy = UaString::decode(&mut r)?
            .as_str()
            .and_then(SecurityPolicy::from_uri)
            .ok_or(RecordError::Field("security_policy"))?;
        let security_mode = MessageSecurityMode::decode(&mut r)?;
        let endpoint_url = UaString::decode(&mut r)?;
        let timeout = Duration::from_millis(u64::decode(&mut r)?);
        let locale_ids = Option::<Vec<UaString>>::decode(&mut r)?.unwrap_or_default();
        let created = DateTime::decode(&mut r)?;
        let activated = bool::decode(&mut r)?;
        let has_ecc = match format {
            FORMAT_CONTINUATION => bool::decode(&mut r)?,
            f => f == FORMAT_ECC,
        };
        let ecc = if has_ecc {
            let client_nonce = ByteString::decode(&mut r)?.as_bytes_or_empty().to_vec();
            let ephemeral = match curve_of(u8::decode(&mut r)?)? {
                None => None,
                Some(curve) => Some((
                    curve,
                    ByteString::decode(&mut r)?
                        .as_bytes()
                        .filter(|b| !b.is_empty())
                        .ok_or(RecordError::Field("ecc"))?
                        .to_vec(),
                )),
            };
            Some(EccRecord {
                client_nonce,
                ephemeral,
            })
        } else {
            None
        };
        let continuation_points = if format == FORMAT_CONTINUATION {
            decode_continuation_points(&mut r)?
        } else {
            Vec::new()
        };
        r.finish()?;
        Ok(SessionRecord {
            owner,
            version,
            session_id,
            token,
            server_nonce,
            client_thumbprint,
            client_uri,
            name,
            user,
            security_policy,
            security_mode,
            endpoint_url,
            timeout,
            locale_ids,
            created,
            activated,
            ecc,
            continuation_points,
        })
    }
}

/// The continuation points at the end of a format 3 session record: at
/// least one, within [`MAX_CONTINUATION_BYTES`].
fn decode_continuation_points(r: &mut Reader<'_>) -> Result<Vec<ContinuationRecord>, RecordError> {
    let n = u32::decode(r)?;
    // Each point takes at least 30 bytes: a count larger than what is
    // left is a bad record, not an allocation.
    if n == 0 || n > MAX_CONTINUATION_POINTS || n as usize > r.remaining() / 30 {
        return Err(RecordError::Field("continuation_points"));
    }
    let start = r.remaining();
    let mut points = Vec::with_capacity(n as usize);
    for _ in 0..n {
        points.push(ContinuationRecord::decode(r)?);
        if start - r.remaining() > MAX_CONTINUATION_BYTES {
            return Err(RecordError::Field("continuation_points"));
        }
    }
    Ok(points)
}

/// The first bytes of a subscriptions record.
const SUBSCRIPTIONS_TAG: &[u8; 4] = b"UASu";

/// The subscriptions of one session as the cluster mirrors them (written
/// by the session's owner after each Publish answer, coalesced), kept
/// under the session's key in their own bucket.
#[derive(Debug, Clone, PartialEq)]
pub struct SubscriptionsRecord {
    /// The node that wrote it.
    pub owner: String,
    /// Bumped by every write.
    pub version: u64,
    /// The session they belong to.
    pub session_id: NodeId,
    /// Its subscriptions.
    pub subscriptions: Vec<SubscriptionImage>,
}

fn encode_image(w: &mut Vec<u8>, s: &SubscriptionImage, format: u8) {
    s.id.encode(w);
    u64::try_from(s.interval.as_micros())
        .unwrap_or(u64::MAX)
        .encode(w);
    s.lifetime_count.encode(w);
    s.keep_alive_count.encode(w);
    s.max_notifications.encode(w);
    s.priority.encode(w);
    s.enabled.encode(w);
    s.next_seq.encode(w);
    Some(s.retransmission.clone()).encode(w);
    s.next_item_id.encode(w);
    u32::try_from(s.items.len()).unwrap_or(u32::MAX).encode(w);
    for i in &s.items {
        i.id.encode(w);
        i.client_handle.encode(w);
        i.target.node_id.encode(w);
        i.target.attribute_id.encode(w);
        i.target.index_range.encode(w);
        i.mode.encode(w);
        u64::try_from(i.sampling_interval.as_micros())
            .unwrap_or(u64::MAX)
            .encode(w);
        i.sampled.encode(w);
        i.queue_size.encode(w);
        i.discard_oldest.encode(w);
        i.timestamps.encode(w);
        i.trigger.encode(w);
        i.deadband.encode(w);
        if format >= FORMAT_EVENTS {
            i.event_filter.is_some().encode(w);
            if let Some(f) = &i.event_filter {
                f.encode(w);
            }
        }
        if format >= FORMAT_QUEUES {
            i.last.is_some().encode(w);
            if let Some(v) = &i.last {
                v.encode(w);
            }
            Some(i.queued.clone()).encode(w);
        }
        if format >= FORMAT_EVENT_QUEUES {
            u32::try_from(i.events.len()).unwrap_or(u32::MAX).encode(w);
            for e in &i.events {
                e.overflow.encode(w);
                Some(e.fields.clone()).encode(w);
            }
        }
    }
}

/// True when some item of `subs` carries unsent values or events (the
/// record is then format 4, or 5 with events).
fn has_unsent(subs: &[SubscriptionImage]) -> bool {
    subs.iter().any(|s| {
        s.items
            .iter()
            .any(|i| i.last.is_some() || !i.queued.is_empty() || !i.events.is_empty())
    })
}

/// True when some item of `subs` carries unsent events (format 5).
fn has_unsent_events(subs: &[SubscriptionImage]) -> bool {
    subs.iter()
        .any(|s| s.items.iter().any(|i| !i.events.is_empty()))
}

/// Leaves the unsent events out of `subs` (for a set where some live node
/// does not read format 5); how many were left out.
pub fn drop_unsent_events(subs: &mut [SubscriptionImage]) -> usize {
    let mut dropped = 0;
    for i in subs.iter_mut().flat_map(|s| s.items.iter_mut()) {
        dropped += i.events.len();
        i.events.clear();
    }
    dropped
}

fn value_len(v: &uascale_types::DataValue) -> usize {
    let mut w = Vec::new();
    v.encode(&mut w);
    w.len()
}

/// Makes the record of `subs` fit into `limit` bytes by dropping unsent
/// values: from the item whose queue takes the most bytes, its oldest
/// first, the first value it keeps marked Overflow (as a queue overflow
/// is, Part 4 §7.39.1: the client learns that values are missing). Each
/// item keeps its newest value while that is enough; only when it is not
/// do the items lose every unsent value and event and their last value
/// (the node that restores them then reports each item's current value,
/// as without them). Returns how many queued values and events were
/// dropped.
pub fn fit_unsent(
    owner: &str,
    session_id: &NodeId,
    subs: &mut [SubscriptionImage],
    limit: usize,
) -> usize {
    let size = |subs: &[SubscriptionImage]| {
        SubscriptionsRecord {
            owner: owner.to_owned(),
            version: u64::MAX,
            session_id: session_id.clone(),
            subscriptions: subs.to_vec(),
        }
        .encode()
        .len()
    };
    let mut dropped = 0;
    let mut total = size(subs);
    while total > limit {
        let mut excess = total - limit;
        // (bytes queued, subscription, item) of every item that can lose
        // a value and still keep one.
        let mut heap: std::collections::BinaryHeap<(usize, usize, usize)> = subs
            .iter()
            .enumerate()
            .flat_map(|(si, s)| {
                s.items
                    .iter()
                    .enumerate()
                    .filter(|(_, i)| i.queued.len() > 1)
                    .map(move |(ii, i)| (i.queued.iter().map(value_len).sum(), si, ii))
            })
            .collect();
        if heap.is_empty() {
            for i in subs.iter_mut().flat_map(|s| s.items.iter_mut()) {
                dropped += i.queued.len() + i.events.len();
                i.queued.clear();
                i.events.clear();
                i.last = None;
            }
            return dropped;
        }
        while excess > 0 {
            let Some((bytes, si, ii)) = heap.pop() else {
                break;
            };
            let Some(item) = subs.get_mut(si).and_then(|s| s.items.get_mut(ii)) else {
                continue;
            };
            if item.queued.len() < 2 {
                continue;
            }
            let gone = value_len(&item.queued.remove(0));
            dropped += 1;
            excess = excess.saturating_sub(gone);
            if let Some(first) = item.queued.first_mut() {
                first.status = Some(uascale_types::StatusCode(
                    first.status_or_good().0 | crate::subscription::item::OVERFLOW_BITS,
                ));
            }
            if item.queued.len() > 1 {
                heap.push((bytes.saturating_sub(gone), si, ii));
            }
        }
        // The Overflow marks may have added a few bytes: measure again.
        total = size(subs);
    }
    dropped
}

/// The most subscriptions, and items per subscription, a record may hold.
const MAX_IMAGES: u32 = 10_000;

fn decode_image(r: &mut Reader<'_>, format: u8) -> Result<SubscriptionImage, RecordError> {
    let id = u32::decode(r)?;
    let interval = Duration::from_micros(u64::decode(r)?);
    let lifetime_count = u32::decode(r)?;
    let keep_alive_count = u32::decode(r)?;
    let max_notifications = u32::decode(r)?;
    let priority = u8::decode(r)?;
    let enabled = bool::decode(r)?;
    let next_seq = u32::decode(r)?;
    let retransmission =
        Option::<Vec<uascale_types::NotificationMessage>>::decode(r)?.unwrap_or_default();
    let next_item_id = u32::decode(r)?;
    let n = u32::decode(r)?;
    // Each item takes at least 40 bytes: a count larger than what is left
    // is a bad record, not an allocation.
    if n > MAX_IMAGES || n as usize > r.remaining() / 40 {
        return Err(RecordError::Field("items"));
    }
    let mut items = Vec::with_capacity(n as usize);
    for _ in 0..n {
        items.push(ItemImage {
            id: u32::decode(r)?,
            client_handle: u32::decode(r)?,
            target: crate::subscription::item::ItemTarget {
                node_id: NodeId::decode(r)?,
                attribute_id: u32::decode(r)?,
                index_range: UaString::decode(r)?,
            },
            mode: uascale_types::MonitoringMode::decode(r)?,
            sampling_interval: Duration::from_micros(u64::decode(r)?),
            sampled: bool::decode(r)?,
            queue_size: u32::decode(r)?,
            discard_oldest: bool::decode(r)?,
            timestamps: uascale_types::TimestampsToReturn::decode(r)?,
            trigger: uascale_types::DataChangeTrigger::decode(r)?,
            deadband: f64::decode(r)?,
            event_filter: if format >= FORMAT_EVENTS && bool::decode(r)? {
                Some(Box::new(uascale_types::EventFilter::decode(r)?))
            } else {
                None
            },
            last: None,
            queued: Vec::new(),
            events: Vec::new(),
        });
        if format >= FORMAT_QUEUES {
            let Some(item) = items.last_mut() else {
                return Err(RecordError::Field("items"));
            };
            if bool::decode(r)? {
                item.last = Some(uascale_types::DataValue::decode(r)?);
            }
            let queued = Option::<Vec<uascale_types::DataValue>>::decode(r)?.unwrap_or_default();
            // Never more than the item's queue holds; an event item hands
            // over no values.
            if queued.len() > item.queue_size as usize
                || (item.event_filter.is_some() && (item.last.is_some() || !queued.is_empty()))
            {
                return Err(RecordError::Field("queued"));
            }
            item.queued = queued;
        }
        if format >= FORMAT_EVENT_QUEUES {
            let Some(item) = items.last_mut() else {
                return Err(RecordError::Field("items"));
            };
            let n = u32::decode(r)?;
            // Never more than the item's queue holds, only for an event
            // item, and each at least 5 bytes.
            if n > item.queue_size
                || (n > 0 && item.event_filter.is_none())
                || n as usize > r.remaining() / 5
            {
                return Err(RecordError::Field("events"));
            }
            for _ in 0..n {
                let overflow = bool::decode(r)?;
                let fields = Option::<Vec<uascale_types::Variant>>::decode(r)?.unwrap_or_default();
                item.events
                    .push(crate::subscription::UnsentEvent { overflow, fields });
            }
        }
    }
    if interval.is_zero() {
        return Err(RecordError::Field("interval"));
    }
    Ok(SubscriptionImage {
        id,
        interval,
        lifetime_count,
        keep_alive_count,
        max_notifications,
        priority,
        enabled,
        next_seq,
        retransmission,
        next_item_id,
        items,
    })
}

impl SubscriptionsRecord {
    /// The record's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(256);
        let events = self
            .subscriptions
            .iter()
            .any(|s| s.items.iter().any(|i| i.event_filter.is_some()));
        let format = if has_unsent_events(&self.subscriptions) {
            FORMAT_EVENT_QUEUES
        } else if has_unsent(&self.subscriptions) {
            FORMAT_QUEUES
        } else if events {
            FORMAT_EVENTS
        } else {
            FORMAT
        };
        header_of(&mut w, SUBSCRIPTIONS_TAG, format, &self.owner, self.version);
        self.session_id.encode(&mut w);
        u32::try_from(self.subscriptions.len())
            .unwrap_or(u32::MAX)
            .encode(&mut w);
        for s in &self.subscriptions {
            encode_image(&mut w, s, format);
        }
        w
    }

    /// Decodes a record read from the store.
    pub fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        let limits = DecodeLimits {
            // A retransmission queue holds whole messages.
            max_byte_string_length: super::store::MAX_RECORD_BYTES,
            max_array_length: 100_000,
            ..limits()
        };
        let mut r = Reader::new(bytes, &limits)?;
        let (owner, version, format) =
            read_header_of(&mut r, SUBSCRIPTIONS_TAG, FORMAT_EVENT_QUEUES)?;
        // Format 3 is a session record layout only.
        if format == FORMAT_CONTINUATION {
            return Err(RecordError::Format(format));
        }
        let session_id = NodeId::decode(&mut r)?;
        let n = u32::decode(&mut r)?;
        if n > MAX_IMAGES || n as usize > r.remaining() / 40 {
            return Err(RecordError::Field("subscriptions"));
        }
        let mut subscriptions = Vec::with_capacity(n as usize);
        for _ in 0..n {
            subscriptions.push(decode_image(&mut r, format)?);
        }
        r.finish()?;
        Ok(SubscriptionsRecord {
            owner,
            version,
            session_id,
            subscriptions,
        })
    }
}

/// The first bytes of a value record.
const VALUE_TAG: &[u8; 4] = b"UASv";

/// A variable's value as the cluster mirrors it: the node that wrote it
/// (the one writer of the value), the variable and the value.
#[derive(Debug, Clone, PartialEq)]
pub struct ValueRecord {
    /// The node that wrote it.
    pub owner: String,
    /// The variable.
    pub node_id: NodeId,
    /// Its value.
    pub value: uascale_types::Variant,
}

impl ValueRecord {
    /// The record's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(64);
        header(&mut w, VALUE_TAG, &self.owner, 0);
        self.node_id.encode(&mut w);
        self.value.encode(&mut w);
        w
    }

    /// Decodes a record read from the store.
    pub fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        let limits = DecodeLimits {
            max_byte_string_length: super::store::MAX_RECORD_BYTES,
            max_string_length: super::store::MAX_RECORD_BYTES,
            max_array_length: 100_000,
            ..limits()
        };
        let mut r = Reader::new(bytes, &limits)?;
        let (owner, _) = read_header(&mut r, VALUE_TAG)?;
        let node_id = NodeId::decode(&mut r)?;
        let value = uascale_types::Variant::decode(&mut r)?;
        r.finish()?;
        Ok(ValueRecord {
            owner,
            node_id,
            value,
        })
    }
}

/// The store key of variable `node`: `v.` and the hex of its binary
/// encoding (any NodeId, within the store's key length).
pub fn value_key(node: &NodeId) -> Option<String> {
    let mut b = Vec::new();
    node.encode(&mut b);
    if b.len() > 120 {
        return None;
    }
    let mut key = String::with_capacity(2 + 2 * b.len());
    key.push_str("v.");
    for byte in b {
        key.push_str(&format!("{byte:02x}"));
    }
    Some(key)
}

/// The first bytes of a trusted-certificate record.
const TRUST_TAG: &[u8; 4] = b"UASt";

/// A trusted certificate as the cluster mirrors it: the file's name in
/// the PKI's `trusted/certs` and its bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TrustRecord {
    /// The node that published it.
    pub owner: String,
    /// The file name (no directory part).
    pub file_name: String,
    /// The file's bytes (DER or PEM, as the PKI reads them).
    pub bytes: Vec<u8>,
}

impl TrustRecord {
    /// The record's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(self.bytes.len() + 64);
        header(&mut w, TRUST_TAG, &self.owner, 0);
        UaString::from(self.file_name.as_str()).encode(&mut w);
        ByteString::new(self.bytes.clone()).encode(&mut w);
        w
    }

    /// Decodes a record read from the store; the file name must be a plain
    /// name (no separator, not `.` or `..`), so a record cannot write
    /// outside the directory.
    pub fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        let limits = DecodeLimits {
            max_byte_string_length: super::store::MAX_RECORD_BYTES,
            ..limits()
        };
        let mut r = Reader::new(bytes, &limits)?;
        let (owner, _) = read_header(&mut r, TRUST_TAG)?;
        let file_name = UaString::decode(&mut r)?
            .as_str()
            .filter(|n| is_plain_file_name(n))
            .ok_or(RecordError::Field("file_name"))?
            .to_owned();
        let bytes = ByteString::decode(&mut r)?.as_bytes_or_empty().to_vec();
        r.finish()?;
        Ok(TrustRecord {
            owner,
            file_name,
            bytes,
        })
    }
}

/// A file name without any directory part.
pub fn is_plain_file_name(n: &str) -> bool {
    !n.is_empty() && n.len() <= 100 && n != "." && n != ".." && !n.contains(['/', '\\', '\0'])
}

/// The store key of the trusted certificate file `file_name`: `t.` and
/// the hex of the name.
pub fn trust_key(file_name: &str) -> String {
    let mut key = String::with_capacity(2 + 2 * file_name.len());
    key.push_str("t.");
    for byte in file_name.bytes() {
        key.push_str(&format!("{byte:02x}"));
    }
    key
}

/// A node's heartbeat: the node id and a counter bumped by every beat.
/// Liveness is judged on the reader's own clock (when the counter last
/// changed), so the nodes' clocks need not agree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRecord {
    /// The node.
    pub node_id: String,
    /// Bumped by every heartbeat.
    pub beat: u64,
    /// True while the node cannot write its mirror (it serves its own
    /// sessions and catches up later).
    pub degraded: bool,
}

impl NodeRecord {
    /// The record's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(32);
        header(&mut w, NODE_TAG, &self.node_id, self.beat);
        self.degraded.encode(&mut w);
        w
    }

    /// Decodes a record read from the store.
    pub fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        let limits = limits();
        let mut r = Reader::new(bytes, &limits)?;
        let (node_id, beat) = read_header(&mut r, NODE_TAG)?;
        let degraded = bool::decode(&mut r)?;
        r.finish()?;
        Ok(NodeRecord {
            node_id,
            beat,
            degraded,
        })
    }
}

/// A node's status, beside its heartbeat (in a bucket of its own, which
/// nodes of older builds neither watch nor meet): its entry in the
/// cluster's `RedundantServerArray` (Part 5 §6.3.9), and the newest record
/// format it reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusRecord {
    /// The node.
    pub node_id: String,
    /// The heartbeat counter when it was written (a status whose beat is
    /// far from the node's heartbeat is stale: the node runs a build that
    /// does not write it).
    pub beat: u64,
    /// Its own ServiceLevel (0 while it shuts down).
    pub service_level: u8,
    /// Its own ServerState (Shutdown while it shuts down).
    pub state: uascale_types::ServerState,
    /// The newest record format it reads ([`READS`] of its build).
    pub reads: u8,
}

impl StatusRecord {
    /// The record's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Vec::with_capacity(40);
        header(&mut w, STATUS_TAG, &self.node_id, self.beat);
        self.service_level.encode(&mut w);
        self.state.0.encode(&mut w);
        self.reads.encode(&mut w);
        w
    }

    /// Decodes a record read from the store.
    pub fn decode(bytes: &[u8]) -> Result<Self, RecordError> {
        let limits = limits();
        let mut r = Reader::new(bytes, &limits)?;
        let (node_id, beat) = read_header(&mut r, STATUS_TAG)?;
        let service_level = u8::decode(&mut r)?;
        let state = uascale_types::ServerState(i32::decode(&mut r)?);
        let reads = u8::decode(&mut r)?;
        if reads < FORMAT {
            return Err(RecordError::Field("reads"));
        }
        r.finish()?;
        Ok(StatusRecord {
            node_id,
            beat,
            service_level,
            state,
            reads,
        })
    }
}

/// The store key of the session whose authentication token is `token`:
/// `s.` and the hex of the token's 32 bytes. `None` for a token this
/// server does not issue (such a session cannot exist anywhere).
pub fn session_key(token: &NodeId) -> Option<String> {
    let uascale_types::Identifier::Opaque(b) = &token.identifier else {
        return None;
    };
    let bytes = b
        .as_bytes()
        .filter(|b| b.len() == 32 && token.namespace == 0)?;
    let mut key = String::with_capacity(2 + 64);
    key.push_str("s.");
    for byte in bytes {
        key.push_str(&format!("{byte:02x}"));
    }
    Some(key)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Every truncation of `bytes` fails to decode, and each byte flipped
    /// with `flip` decodes or fails without panicking.
    fn damaged_fail_cleanly<T>(
        bytes: &[u8],
        flip: u8,
        decode: impl Fn(&[u8]) -> Result<T, RecordError>,
    ) {
        for len in 0..bytes.len() {
            assert!(decode(&bytes[..len]).is_err(), "{len}");
        }
        for i in 0..bytes.len() {
            let mut b = bytes.to_vec();
            b[i] ^= flip;
            let _ = decode(&b);
        }
    }

    /// A session record as a test makes it.
    pub(crate) fn sample(owner: &str, token_byte: u8) -> SessionRecord {
        SessionRecord {
            owner: owner.to_owned(),
            version: 1,
            session_id: NodeId::guid(1, uascale_types::Guid::from_bytes([token_byte; 16])),
            token: NodeId::opaque(0, vec![token_byte; 32]),
            server_nonce: [token_byte; 32],
            client_thumbprint: Some([7; 20]),
            client_uri: UaString::from("urn:client"),
            name: UaString::from("s"),
            user: UserIdentity::X509(Box::new(crate::identity::X509User {
                subject: "CN=u".into(),
                thumbprint: [9; 20],
            })),
            security_policy: SecurityPolicy::Basic256Sha256,
            security_mode: MessageSecurityMode::SignAndEncrypt,
            endpoint_url: UaString::from("opc.tcp://front:4840"),
            timeout: Duration::from_secs(30),
            locale_ids: vec![UaString::from("en")],
            created: DateTime::from_ticks(5),
            activated: true,
            ecc: None,
            continuation_points: Vec::new(),
        }
    }

    /// [`sample`] on an ECC policy, with its ECC state.
    pub(crate) fn sample_ecc(owner: &str, token_byte: u8) -> SessionRecord {
        SessionRecord {
            security_policy: SecurityPolicy::EccNistP256,
            ecc: Some(EccRecord {
                client_nonce: vec![4; 64],
                ephemeral: Some((EccCurve::NistP256, vec![5; 32])),
            }),
            ..sample(owner, token_byte)
        }
    }

    #[test]
    fn records_round_trip() {
        let mut s = sample("n1", 3);
        assert_eq!(SessionRecord::decode(&s.encode()).unwrap(), s);
        s.client_thumbprint = None;
        s.user = UserIdentity::UserName("bob".into());
        s.security_policy = SecurityPolicy::None;
        assert_eq!(SessionRecord::decode(&s.encode()).unwrap(), s);
        s.user = UserIdentity::Anonymous;
        assert_eq!(SessionRecord::decode(&s.encode()).unwrap(), s);
        let n = NodeRecord {
            node_id: "n2".into(),
            beat: 9,
            degraded: true,
        };
        assert_eq!(NodeRecord::decode(&n.encode()).unwrap(), n);
        let st = StatusRecord {
            node_id: "n2".into(),
            beat: 9,
            service_level: 0,
            state: uascale_types::ServerState::Shutdown,
            reads: READS,
        };
        assert_eq!(StatusRecord::decode(&st.encode()).unwrap(), st);
        damaged_fail_cleanly(&st.encode(), 0xa5, StatusRecord::decode);
        assert_eq!(
            StatusRecord::decode(&n.encode()),
            Err(RecordError::WrongKind)
        );
        assert_eq!(
            StatusRecord::decode(&StatusRecord { reads: 0, ..st }.encode()),
            Err(RecordError::Field("reads"))
        );
    }

    /// The ECC state rides in format 2; a session without it is still
    /// written as format 1 (readable by nodes that know only that), and a
    /// format 1 record reads as a session without ECC state.
    #[test]
    fn ecc_state_round_trips_in_its_own_format() {
        let mut e = sample_ecc("n1", 3);
        let bytes = e.encode();
        assert_eq!(bytes[4], FORMAT_ECC);
        assert_eq!(SessionRecord::decode(&bytes).unwrap(), e);
        for curve in [EccCurve::NistP384, EccCurve::Curve25519] {
            e.ecc.as_mut().unwrap().ephemeral = Some((curve, vec![6; 48]));
            assert_eq!(SessionRecord::decode(&e.encode()).unwrap(), e);
        }
        e.ecc.as_mut().unwrap().ephemeral = None;
        assert_eq!(SessionRecord::decode(&e.encode()).unwrap(), e);
        let plain = sample("n1", 3).encode();
        assert_eq!(plain[4], FORMAT);
        assert_eq!(SessionRecord::decode(&plain).unwrap().ecc, None);
        // Every truncation of the longer record fails cleanly, and so do
        // flipped bytes, an unknown curve, and an empty private key.
        let bytes = sample_ecc("n1", 3).encode();
        damaged_fail_cleanly(&bytes, 0xa5, SessionRecord::decode);
        let mut unknown = bytes.clone();
        let at = bytes.len() - 4 - 32 - 1;
        assert_eq!(unknown[at], 1, "the curve's tag");
        unknown[at] = 9;
        assert_eq!(
            SessionRecord::decode(&unknown),
            Err(RecordError::Field("ecc"))
        );
        let mut empty = sample_ecc("n1", 3);
        empty.ecc.as_mut().unwrap().ephemeral = Some((EccCurve::NistP256, vec![]));
        assert_eq!(
            SessionRecord::decode(&empty.encode()),
            Err(RecordError::Field("ecc"))
        );
        // Format 2 is a session layout only.
        let mut node = NodeRecord {
            node_id: "n".into(),
            beat: 1,
            degraded: false,
        }
        .encode();
        node[4] = FORMAT_ECC;
        assert_eq!(NodeRecord::decode(&node), Err(RecordError::Format(2)));
    }

    /// A continuation point of a browse of `node` as a test makes it.
    pub(crate) fn point(id: u8, node: u32, returned: u32) -> ContinuationRecord {
        ContinuationRecord {
            id: vec![id; 16],
            browse: uascale_types::BrowseDescription {
                node_id: NodeId::ns0(node),
                browse_direction: uascale_types::BrowseDirection::Both,
                reference_type_id: NodeId::ns0(33),
                include_subtypes: true,
                node_class_mask: 3,
                result_mask: 0x3f,
            },
            max: 3,
            returned,
        }
    }

    /// Continuation points ride in format 3, with or without ECC state; a
    /// session without them is still written as format 1 or 2, and those
    /// formats still read (as sessions holding no continuation points).
    #[test]
    fn continuation_points_travel_in_format_3_and_older_formats_still_read() {
        let mut s = sample("n1", 3);
        s.continuation_points = vec![point(1, 85, 3), point(2, 2253, 6)];
        let bytes = s.encode();
        assert_eq!(bytes[4], FORMAT_CONTINUATION);
        assert_eq!(SessionRecord::decode(&bytes).unwrap(), s);
        damaged_fail_cleanly(&bytes, 0xa5, SessionRecord::decode);
        let mut e = sample_ecc("n1", 3);
        e.continuation_points = vec![point(1, 85, 3)];
        let bytes = e.encode();
        assert_eq!(bytes[4], FORMAT_CONTINUATION);
        assert_eq!(SessionRecord::decode(&bytes).unwrap(), e);
        damaged_fail_cleanly(&bytes, 0x5a, SessionRecord::decode);
        // The older formats, byte for byte as the builds before wrote them:
        // format 1 ends with `activated`, format 2 with the ECC state.
        let old = sample("n1", 3).encode();
        assert_eq!(old[4], FORMAT);
        let back = SessionRecord::decode(&old).unwrap();
        assert!(back.continuation_points.is_empty());
        assert_eq!(back, sample("n1", 3));
        let old_ecc = sample_ecc("n1", 3).encode();
        assert_eq!(old_ecc[4], FORMAT_ECC);
        assert_eq!(
            SessionRecord::decode(&old_ecc).unwrap(),
            sample_ecc("n1", 3)
        );
        // A format 1 record as the builds before format 3 wrote it (these
        // bytes are frozen: `sample("n1", 3)`).
        let frozen = "5541537301020000006e310100000000000000040100030303030303030303030303\
            030303030500002000000003030303030303030303030303030303030303030303030303\
            030303030303032000000003030303030303030303030303030303030303030303030303\
            030303030303031400000007070707070707070707070707070707070707070a00000075\
            726e3a636c69656e7401000000730204000000434e3d7514000000090909090909090909\
            090909090909090909090939000000687474703a2f2f6f7063666f756e646174696f6e2e\
            6f72672f55412f5365637572697479506f6c69637923426173696332353653686132353603\
            000000140000006f70632e7463703a2f2f66726f6e743a34383430307500000000000001\
            00000002000000656e050000000000000001";
        let frozen: Vec<u8> = (0..frozen.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&frozen[i..i + 2], 16).unwrap())
            .collect();
        assert_eq!(SessionRecord::decode(&frozen).unwrap(), sample("n1", 3));
        // A format 1 record with the point appended (no ECC flag) is not
        // misread as format 3.
        let mut cut = s.encode();
        cut[4] = FORMAT;
        assert!(SessionRecord::decode(&cut).is_err());
        // The next format is refused, not misread.
        let mut newer = s.encode();
        newer[4] = FORMAT_CONTINUATION + 1;
        assert_eq!(
            SessionRecord::decode(&newer),
            Err(RecordError::Format(FORMAT_CONTINUATION + 1))
        );
    }

    /// What a format 3 record may carry is bounded: a count, an id, a page
    /// size that cannot be, and more bytes of points than the bound, are
    /// bad records.
    #[test]
    fn continuation_points_are_bounded() {
        let base = sample("n1", 3);
        let bad = |points: Vec<ContinuationRecord>| {
            SessionRecord::decode(
                &SessionRecord {
                    continuation_points: points,
                    ..base.clone()
                }
                .encode(),
            )
        };
        let field = Err(RecordError::Field("continuation_points"));
        assert_eq!(
            bad(vec![ContinuationRecord {
                id: vec![],
                ..point(1, 85, 0)
            }]),
            field
        );
        assert_eq!(
            bad(vec![ContinuationRecord {
                id: vec![1; MAX_CONTINUATION_ID + 1],
                ..point(1, 85, 0)
            }]),
            field
        );
        assert_eq!(
            bad(vec![ContinuationRecord {
                max: 0,
                ..point(1, 85, 0)
            }]),
            field
        );
        // A count of points larger than the bytes left.
        let mut counted = SessionRecord {
            continuation_points: vec![point(1, 85, 0)],
            ..base.clone()
        }
        .encode();
        let at = counted.len() - point(1, 85, 0).encoded_len() - 4;
        counted[at..at + 4].copy_from_slice(&1000u32.to_le_bytes());
        assert_eq!(SessionRecord::decode(&counted), field);
        counted[at..at + 4].copy_from_slice(&0u32.to_le_bytes());
        assert!(SessionRecord::decode(&counted).is_err());
        // Large points: a record holds what fits into the bound, no more.
        let large = |id: u8| ContinuationRecord {
            browse: uascale_types::BrowseDescription {
                node_id: NodeId::string(2, "x".repeat(3000)),
                ..point(id, 85, 0).browse
            },
            ..point(id, 85, 0)
        };
        let many: Vec<ContinuationRecord> = (0..4).map(large).collect();
        let kept = bounded(many.clone());
        assert_eq!(kept, many[..2].to_vec());
        assert!(
            kept.iter()
                .map(ContinuationRecord::encoded_len)
                .sum::<usize>()
                <= MAX_CONTINUATION_BYTES
        );
        assert_eq!(bad(kept.clone()).unwrap().continuation_points, kept);
        assert_eq!(bad(many), field, "a record over the bound is refused");
        // A small point after one too large still goes.
        let mixed = bounded([large(1), large(2), large(3), point(4, 85, 0)]);
        assert_eq!(mixed.len(), 3);
        assert_eq!(mixed[2], point(4, 85, 0));
    }

    #[test]
    fn bad_records_are_errors_not_panics() {
        let good = sample("n1", 3).encode();
        // Every truncation fails cleanly.
        for len in 0..good.len() {
            assert!(SessionRecord::decode(&good[..len]).is_err(), "{len}");
        }
        let mut trailing = good.clone();
        trailing.push(0);
        assert!(SessionRecord::decode(&trailing).is_err());
        assert_eq!(
            SessionRecord::decode(
                &NodeRecord {
                    node_id: "n".into(),
                    beat: 1,
                    degraded: false
                }
                .encode()
            ),
            Err(RecordError::WrongKind)
        );
        let mut format = good.clone();
        format[4] = 99;
        assert_eq!(SessionRecord::decode(&format), Err(RecordError::Format(99)));
        // Truncations fail; bytes flipped one at a time never panic.
        damaged_fail_cleanly(&good, 0xa5, SessionRecord::decode);
        let mut empty_owner = sample("", 3);
        empty_owner.owner.clear();
        assert_eq!(
            SessionRecord::decode(&empty_owner.encode()),
            Err(RecordError::Field("owner"))
        );
    }

    fn subscriptions() -> SubscriptionsRecord {
        SubscriptionsRecord {
            owner: "n1".into(),
            version: 3,
            session_id: NodeId::numeric(1, 7),
            subscriptions: vec![SubscriptionImage {
                id: 0x0100_0005,
                interval: Duration::from_millis(250),
                lifetime_count: 60,
                keep_alive_count: 10,
                max_notifications: 0,
                priority: 1,
                enabled: true,
                next_seq: 42,
                retransmission: vec![uascale_types::NotificationMessage {
                    sequence_number: 41,
                    publish_time: DateTime::from_ticks(9),
                    notification_data: Some(vec![]),
                }],
                next_item_id: 3,
                items: vec![ItemImage {
                    id: 2,
                    client_handle: 77,
                    target: crate::subscription::item::ItemTarget {
                        node_id: NodeId::string(2, "Demo.Dynamic.Counter"),
                        attribute_id: 13,
                        index_range: UaString::null(),
                    },
                    mode: uascale_types::MonitoringMode::Reporting,
                    sampling_interval: Duration::from_millis(100),
                    sampled: false,
                    queue_size: 1,
                    discard_oldest: true,
                    timestamps: uascale_types::TimestampsToReturn::Both,
                    trigger: uascale_types::DataChangeTrigger::StatusValue,
                    deadband: 0.5,
                    event_filter: None,
                    last: None,
                    queued: Vec::new(),
                    events: Vec::new(),
                }],
            }],
        }
    }

    /// The same record with an event item on the Server object beside the
    /// data-change item.
    fn with_event_item() -> SubscriptionsRecord {
        let mut r = subscriptions();
        let filter = uascale_types::EventFilter {
            select_clauses: Some(vec![uascale_types::SimpleAttributeOperand {
                type_definition_id: NodeId::ns0(2041),
                browse_path: Some(vec![uascale_types::QualifiedName::new(0, "Severity")]),
                attribute_id: 13,
                index_range: UaString::null(),
            }]),
            where_clause: uascale_types::ContentFilter { elements: None },
        };
        r.subscriptions[0].items.push(ItemImage {
            id: 3,
            client_handle: 78,
            target: crate::subscription::item::ItemTarget {
                node_id: NodeId::ns0(2253),
                attribute_id: 12,
                index_range: UaString::null(),
            },
            mode: uascale_types::MonitoringMode::Reporting,
            sampling_interval: Duration::ZERO,
            sampled: false,
            queue_size: 10,
            discard_oldest: true,
            timestamps: uascale_types::TimestampsToReturn::Both,
            trigger: uascale_types::DataChangeTrigger::default(),
            deadband: 0.0,
            event_filter: Some(Box::new(filter)),
            last: None,
            queued: Vec::new(),
            events: Vec::new(),
        });
        r
    }

    #[test]
    fn event_items_travel_in_format_2_and_only_they_need_it() {
        // Data-change items only: format 1, readable by older nodes.
        assert_eq!(subscriptions().encode()[4], FORMAT);
        let r = with_event_item();
        let bytes = r.encode();
        assert_eq!(bytes[4], FORMAT_EVENTS);
        assert_eq!(SubscriptionsRecord::decode(&bytes).unwrap(), r);
        damaged_fail_cleanly(&bytes, 0x5a, SubscriptionsRecord::decode);
        // A format this build does not know is refused, not misread.
        let mut newer = bytes.clone();
        newer[4] = FORMAT_EVENTS + 1;
        assert_eq!(
            SubscriptionsRecord::decode(&newer),
            Err(RecordError::Format(FORMAT_EVENTS + 1))
        );
    }

    fn stamped(x: i32) -> uascale_types::DataValue {
        uascale_types::DataValue {
            value: Some(uascale_types::Variant::Int32(x)),
            source_timestamp: Some(DateTime::from_ticks(i64::from(x))),
            ..Default::default()
        }
    }

    /// [`subscriptions`] as a drain writes it: its item (queue 10) with
    /// three values queued and its last one.
    pub(crate) fn with_unsent() -> SubscriptionsRecord {
        let mut r = subscriptions();
        let item = &mut r.subscriptions[0].items[0];
        item.queue_size = 10;
        item.last = Some(stamped(3));
        item.queued = (1..=3).map(stamped).collect();
        r
    }

    /// The bytes of [`subscriptions`] in format 1, as the build before
    /// format 4 wrote them (captured from it).
    const SUBSCRIPTIONS_FORMAT_1: &str = "5541537501020000006e31030000000000000001010700010000000500000190d00300000000003c0000000a0000000000000001012a00000001000000290000000900000000000000000000000300000001000000020000004d0000000302001400000044656d6f2e44796e616d69632e436f756e7465720d000000ffffffff02000000a0860100000000000001000000010200000001000000000000000000e03f";

    #[test]
    fn unsent_values_travel_in_format_4_and_only_they_need_it() {
        assert_eq!(subscriptions().encode()[4], FORMAT);
        assert_eq!(with_event_item().encode()[4], FORMAT_EVENTS);
        let r = with_unsent();
        let bytes = r.encode();
        assert_eq!(bytes[4], FORMAT_QUEUES);
        assert_eq!(SubscriptionsRecord::decode(&bytes).unwrap(), r);
        damaged_fail_cleanly(&bytes, 0x5a, SubscriptionsRecord::decode);
        // Beside an event item; a last value alone; queued values alone.
        let mut both = with_event_item();
        both.subscriptions[0].items[0] = r.subscriptions[0].items[0].clone();
        assert_eq!(SubscriptionsRecord::decode(&both.encode()).unwrap(), both);
        let mut last_only = with_unsent();
        last_only.subscriptions[0].items[0].queued.clear();
        assert_eq!(last_only.encode()[4], FORMAT_QUEUES);
        assert_eq!(
            SubscriptionsRecord::decode(&last_only.encode()).unwrap(),
            last_only
        );
        let mut queued_only = with_unsent();
        queued_only.subscriptions[0].items[0].last = None;
        assert_eq!(
            SubscriptionsRecord::decode(&queued_only.encode()).unwrap(),
            queued_only
        );
        // The older formats still read: the frozen bytes of format 1.
        let frozen: Vec<u8> = (0..SUBSCRIPTIONS_FORMAT_1.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&SUBSCRIPTIONS_FORMAT_1[i..i + 2], 16).unwrap())
            .collect();
        assert_eq!(subscriptions().encode(), frozen, "format 1 is unchanged");
        assert_eq!(
            SubscriptionsRecord::decode(&frozen).unwrap(),
            subscriptions()
        );
        // More values than the item's queue holds, values of an event
        // item, a session record's format, a newer format: bad records.
        let mut over = with_unsent();
        over.subscriptions[0].items[0].queue_size = 2;
        assert_eq!(
            SubscriptionsRecord::decode(&over.encode()),
            Err(RecordError::Field("queued"))
        );
        let mut event_values = with_event_item();
        event_values.subscriptions[0].items[1].last = Some(stamped(1));
        assert_eq!(
            SubscriptionsRecord::decode(&event_values.encode()),
            Err(RecordError::Field("queued"))
        );
        assert_eq!(READS, FORMAT_EVENT_QUEUES, "what the other nodes are told");
        for format in [FORMAT_CONTINUATION, FORMAT_EVENT_QUEUES + 1] {
            let mut b = bytes.clone();
            b[4] = format;
            assert_eq!(
                SubscriptionsRecord::decode(&b),
                Err(RecordError::Format(format))
            );
        }
    }

    /// [`with_event_item`] as a drain writes it: its event item with two
    /// events queued behind the EventQueueOverflow event it made.
    pub(crate) fn with_unsent_events() -> SubscriptionsRecord {
        let mut r = with_event_item();
        let event = |overflow: bool, severity: u16| crate::subscription::UnsentEvent {
            overflow,
            fields: vec![
                uascale_types::Variant::UInt16(severity),
                uascale_types::Variant::String(UaString::from("m")),
            ],
        };
        r.subscriptions[0].items[1].events =
            vec![event(true, 1), event(false, 300), event(false, 500)];
        r
    }

    #[test]
    fn unsent_events_travel_in_format_5_and_only_they_need_it() {
        assert_eq!(with_unsent().encode()[4], FORMAT_QUEUES);
        let r = with_unsent_events();
        let bytes = r.encode();
        assert_eq!(bytes[4], FORMAT_EVENT_QUEUES);
        assert_eq!(SubscriptionsRecord::decode(&bytes).unwrap(), r);
        damaged_fail_cleanly(&bytes, 0x5a, SubscriptionsRecord::decode);
        // Beside a data-change item's unsent values.
        let mut both = r.clone();
        both.subscriptions[0].items[0] = with_unsent().subscriptions[0].items[0].clone();
        assert_eq!(SubscriptionsRecord::decode(&both.encode()).unwrap(), both);
        // Left out for a set where some node reads format 4 only: the
        // record is format 4 then.
        let mut older = both.clone();
        assert_eq!(drop_unsent_events(&mut older.subscriptions), 3);
        assert_eq!(older.encode()[4], FORMAT_QUEUES);
        // More events than the item's queue holds, events on a data-change
        // item: bad records.
        let mut over = r.clone();
        over.subscriptions[0].items[1].queue_size = 2;
        assert_eq!(
            SubscriptionsRecord::decode(&over.encode()),
            Err(RecordError::Field("events"))
        );
        let mut on_data = r.clone();
        on_data.subscriptions[0].items[0].queue_size = 10;
        on_data.subscriptions[0].items[0].events = r.subscriptions[0].items[1].events.clone();
        assert_eq!(
            SubscriptionsRecord::decode(&on_data.encode()),
            Err(RecordError::Field("events"))
        );
    }

    #[test]
    fn unsent_values_over_the_record_size_go_oldest_first_marked() {
        let text = |x: u32| uascale_types::DataValue {
            value: Some(uascale_types::Variant::String(UaString::from(
                format!("{x:>100}").as_str(),
            ))),
            ..Default::default()
        };
        let mut r = with_unsent();
        let small = r.subscriptions[0].items[0].clone();
        let mut big = small.clone();
        big.id = 3;
        big.queue_size = 1000;
        big.queued = (0..200).map(text).collect();
        big.last = big.queued.last().cloned();
        r.subscriptions[0].items.push(big.clone());
        let full = r.encode().len();
        let limit = full - 5_000;
        let (owner, sid) = (r.owner.clone(), r.session_id.clone());
        // A record that fits is left as it is.
        let mut same = r.subscriptions.clone();
        assert_eq!(fit_unsent(&owner, &sid, &mut same, full), 0);
        assert_eq!(same, r.subscriptions);

        let mut subs = r.subscriptions.clone();
        let dropped = fit_unsent(&owner, &sid, &mut subs, limit);
        let fitted = SubscriptionsRecord {
            subscriptions: subs.clone(),
            version: u64::MAX,
            ..r.clone()
        };
        assert!(fitted.encode().len() <= limit);
        let kept = &subs[0].items[1].queued;
        assert_eq!(dropped, 200 - kept.len());
        assert!(dropped >= 40 && !kept.is_empty(), "{dropped}");
        // The newest kept, in order; the first kept marked Overflow.
        let overflow = crate::subscription::item::OVERFLOW_BITS;
        assert_eq!(kept[0].status_or_good().0 & overflow, overflow);
        let unmarked: Vec<_> = kept.iter().map(|v| v.value.clone()).collect();
        let newest: Vec<_> = big.queued[dropped..]
            .iter()
            .map(|v| v.value.clone())
            .collect();
        assert_eq!(unmarked, newest);
        assert!(kept[1..]
            .iter()
            .all(|v| v.status_or_good().0 & overflow == 0));
        // The small queue lost nothing.
        assert_eq!(subs[0].items[0], small);
        assert_eq!(
            SubscriptionsRecord::decode(&fitted.encode()).unwrap(),
            fitted
        );

        // Too small for even one value per item: no unsent value goes,
        // and no last one (the restoring node reports current values).
        let mut subs = r.subscriptions.clone();
        let dropped = fit_unsent(&owner, &sid, &mut subs, 200);
        assert_eq!(dropped, 203);
        assert!(subs[0]
            .items
            .iter()
            .all(|i| i.queued.is_empty() && i.last.is_none()));
    }

    #[test]
    fn subscription_records_round_trip_and_bad_ones_fail() {
        let r = subscriptions();
        let bytes = r.encode();
        assert_eq!(SubscriptionsRecord::decode(&bytes).unwrap(), r);
        damaged_fail_cleanly(&bytes, 0x5a, SubscriptionsRecord::decode);
        assert_eq!(
            SubscriptionsRecord::decode(&sample("n", 1).encode()),
            Err(RecordError::WrongKind)
        );
    }

    #[test]
    fn value_records_round_trip() {
        let v = ValueRecord {
            owner: "n2".into(),
            node_id: NodeId::string(2, "Demo.Static.Scalar.Double"),
            value: uascale_types::Variant::Double(2.5),
        };
        let bytes = v.encode();
        assert_eq!(ValueRecord::decode(&bytes).unwrap(), v);
        damaged_fail_cleanly(&bytes, 0x5a, ValueRecord::decode);
        let k = value_key(&v.node_id).unwrap();
        super::super::store::check_key(&k).unwrap();
        assert_eq!(value_key(&NodeId::string(2, "x".repeat(200))), None);
    }

    #[test]
    fn trust_records_round_trip_and_refuse_paths() {
        let t = TrustRecord {
            owner: "n1".into(),
            file_name: "client [abcd].der".into(),
            bytes: vec![0x30, 0x82, 1, 2],
        };
        assert_eq!(TrustRecord::decode(&t.encode()).unwrap(), t);
        for bad in ["../x.der", "a/b.der", "..", ".", ""] {
            let mut b = t.clone();
            b.file_name = bad.into();
            assert_eq!(
                TrustRecord::decode(&b.encode()),
                Err(RecordError::Field("file_name")),
                "{bad:?}"
            );
        }
        super::super::store::check_key(&trust_key("client [abcd].der")).unwrap();
    }

    #[test]
    fn keys_come_from_issued_tokens_only() {
        let k = session_key(&NodeId::opaque(0, vec![0xab; 32])).unwrap();
        assert_eq!(k.len(), 66);
        assert!(k.starts_with("s.abab"));
        super::super::store::check_key(&k).unwrap();
        assert_eq!(session_key(&NodeId::opaque(0, vec![1; 31])), None);
        assert_eq!(session_key(&NodeId::numeric(0, 5)), None);
        assert_eq!(session_key(&NodeId::opaque(1, vec![1; 32])), None);
    }
}
