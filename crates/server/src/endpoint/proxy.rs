//! The PROXY protocol v2 header a TCP balancer (HAProxy `send-proxy-v2`)
//! puts before the client's bytes, so that the server learns the client's
//! address behind the balancer (`[cluster] proxy_protocol`). Sans-IO: the
//! parser takes bytes and says how many more it needs; the shell drives it
//! over a socket, reading exactly the header and nothing of the Hello.
//!
//! ```text
//! 12 bytes signature  \r\n\r\n\0\r\nQUIT\n
//!  1 byte  version (high nibble, 2) and command (low: 0 LOCAL, 1 PROXY)
//!  1 byte  family (high: 1 IPv4, 2 IPv6) and transport (low: 1 stream)
//!  2 bytes length of what follows (big endian): addresses, then TLVs
//! IPv4: source, destination (4 bytes each), source port, destination port
//! IPv6: the same with 16-byte addresses
//! ```

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

/// The first twelve bytes of every v2 header.
pub const SIGNATURE: [u8; 12] = *b"\r\n\r\n\0\r\nQUIT\n";

/// The fixed part: signature, version/command, family, length.
pub const FIXED_LEN: usize = 16;

/// The longest address block accepted (IPv6 addresses plus room for the
/// TLVs a balancer may add); a longer one is refused, not buffered.
pub const MAX_BODY_LEN: usize = 512;

/// What a header says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyHeader {
    /// A proxied connection from `source` to `destination`.
    Proxied {
        /// The client's address.
        source: SocketAddr,
        /// The address the client connected to (the balancer's).
        destination: SocketAddr,
    },
    /// The balancer's own connection (a health check): LOCAL, or an
    /// address family other than TCP over IPv4/IPv6. The connection's own
    /// address stands.
    Local,
}

impl ProxyHeader {
    /// The client's address, if the header carries one.
    pub fn source(&self) -> Option<SocketAddr> {
        match self {
            ProxyHeader::Proxied { source, .. } => Some(*source),
            ProxyHeader::Local => None,
        }
    }
}

/// Why the bytes are not a PROXY protocol v2 header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyError {
    /// A version 1 (text) header: only v2 is read.
    Version1,
    /// Not a PROXY protocol header at all (e.g. a client that connected
    /// past the balancer and sent its Hello).
    NotProxy,
    /// The version nibble is not 2.
    Version(u8),
    /// The command nibble is neither LOCAL nor PROXY.
    Command(u8),
    /// The address block is shorter than its family needs, or longer
    /// than [`MAX_BODY_LEN`].
    Length(usize),
}

impl std::fmt::Display for ProxyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProxyError::Version1 => f.write_str("PROXY protocol v1 header (only v2 is read)"),
            ProxyError::NotProxy => f.write_str("no PROXY protocol v2 header"),
            ProxyError::Version(v) => write!(f, "PROXY protocol version {v}"),
            ProxyError::Command(c) => write!(f, "PROXY protocol command {c}"),
            ProxyError::Length(n) => write!(f, "PROXY protocol address block of {n} bytes"),
        }
    }
}

impl std::error::Error for ProxyError {}

/// The length of the body that follows the fixed part `fixed` (checked).
pub fn body_len(fixed: &[u8; FIXED_LEN]) -> Result<usize, ProxyError> {
    if fixed.starts_with(b"PROXY ") {
        return Err(ProxyError::Version1);
    }
    if fixed[..12] != SIGNATURE {
        return Err(ProxyError::NotProxy);
    }
    let version = fixed[12] >> 4;
    if version != 2 {
        return Err(ProxyError::Version(version));
    }
    let command = fixed[12] & 0x0f;
    if command > 1 {
        return Err(ProxyError::Command(command));
    }
    let len = usize::from(u16::from_be_bytes([fixed[14], fixed[15]]));
    if len > MAX_BODY_LEN {
        return Err(ProxyError::Length(len));
    }
    Ok(len)
}

/// Parses a whole header: `bytes` starts with it. `Ok(None)`: more bytes
/// are needed; `Ok(Some((header, n)))`: the header is the first `n`
/// bytes.
pub fn parse(bytes: &[u8]) -> Result<Option<(ProxyHeader, usize)>, ProxyError> {
    // A prefix that already cannot be a header fails early.
    let sig = bytes.len().min(12);
    if bytes[..sig] != SIGNATURE[..sig] {
        return Err(
            if bytes.starts_with(b"PROXY") || b"PROXY ".starts_with(bytes) {
                ProxyError::Version1
            } else {
                ProxyError::NotProxy
            },
        );
    }
    let Some(fixed) = bytes.get(..FIXED_LEN) else {
        return Ok(None);
    };
    let mut head = [0u8; FIXED_LEN];
    head.copy_from_slice(fixed);
    let len = body_len(&head)?;
    let Some(body) = bytes.get(FIXED_LEN..FIXED_LEN + len) else {
        return Ok(None);
    };
    Ok(Some((header(&head, body)?, FIXED_LEN + len)))
}

fn port(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}

/// The header of the fixed part `head` and its body.
pub fn header(head: &[u8; FIXED_LEN], body: &[u8]) -> Result<ProxyHeader, ProxyError> {
    if head[12] & 0x0f == 0 {
        return Ok(ProxyHeader::Local);
    }
    let family = head[13];
    match family {
        // TCP over IPv4.
        0x11 => {
            let a = body.get(..12).ok_or(ProxyError::Length(body.len()))?;
            let ip = |at: usize| IpAddr::V4(Ipv4Addr::new(a[at], a[at + 1], a[at + 2], a[at + 3]));
            Ok(ProxyHeader::Proxied {
                source: SocketAddr::new(ip(0), port(a, 8)),
                destination: SocketAddr::new(ip(4), port(a, 10)),
            })
        }
        // TCP over IPv6.
        0x21 => {
            let a = body.get(..36).ok_or(ProxyError::Length(body.len()))?;
            let ip = |at: usize| {
                let mut o = [0u8; 16];
                o.copy_from_slice(&a[at..at + 16]);
                IpAddr::V6(Ipv6Addr::from(o))
            };
            Ok(ProxyHeader::Proxied {
                source: SocketAddr::new(ip(0), port(a, 32)),
                destination: SocketAddr::new(ip(16), port(a, 34)),
            })
        }
        // UNSPEC, UDP, UNIX sockets: nothing to use.
        _ => Ok(ProxyHeader::Local),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A v4 PROXY header (`command` 1 PROXY, 0 LOCAL), then `extra`.
    pub(crate) fn v4(command: u8, extra: &[u8]) -> Vec<u8> {
        let mut b = SIGNATURE.to_vec();
        b.push(0x20 | command);
        b.push(0x11);
        b.extend_from_slice(&(12 + extra.len() as u16).to_be_bytes());
        b.extend_from_slice(&[192, 0, 2, 7, 127, 0, 0, 1]);
        b.extend_from_slice(&50000u16.to_be_bytes());
        b.extend_from_slice(&4840u16.to_be_bytes());
        b.extend_from_slice(extra);
        b
    }

    #[test]
    fn a_good_ipv4_header_names_the_client() {
        let mut b = v4(1, &[0x04, 0, 1, 0xaa]); // with a TLV, skipped
        let n = b.len();
        b.extend_from_slice(b"HEL"); // the client's Hello follows
        let (h, used) = parse(&b).unwrap().unwrap();
        assert_eq!(used, n);
        assert_eq!(h.source(), Some("192.0.2.7:50000".parse().unwrap()));
        assert_eq!(
            h,
            ProxyHeader::Proxied {
                source: "192.0.2.7:50000".parse().unwrap(),
                destination: "127.0.0.1:4840".parse().unwrap()
            }
        );
    }

    #[test]
    fn a_good_ipv6_header_and_local_and_unspec() {
        let mut b = SIGNATURE.to_vec();
        b.extend_from_slice(&[0x21, 0x21, 0, 36]);
        let mut src = [0u8; 16];
        src[15] = 1;
        b.extend_from_slice(&src);
        b.extend_from_slice(&[0u8; 16]);
        b.extend_from_slice(&[0x1f, 0x90, 0x12, 0xe8]);
        let (h, _) = parse(&b).unwrap().unwrap();
        assert_eq!(h.source(), Some("[::1]:8080".parse().unwrap()));
        // LOCAL (a health check): the connection's own address stands.
        let (h, _) = parse(&v4(0, &[])).unwrap().unwrap();
        assert_eq!(h, ProxyHeader::Local);
        let mut unspec = SIGNATURE.to_vec();
        unspec.extend_from_slice(&[0x21, 0x00, 0, 0]);
        assert_eq!(parse(&unspec).unwrap().unwrap().0, ProxyHeader::Local);
    }

    #[test]
    fn truncated_headers_ask_for_more() {
        let b = v4(1, &[]);
        for len in 0..b.len() {
            assert_eq!(parse(&b[..len]), Ok(None), "{len}");
        }
    }

    #[test]
    fn v1_and_garbage_are_refused() {
        assert_eq!(
            parse(b"PROXY TCP4 192.0.2.7 127.0.0.1 50000 4840\r\n"),
            Err(ProxyError::Version1)
        );
        assert_eq!(parse(b"PRO"), Err(ProxyError::Version1));
        // A client that skipped the balancer starts with its Hello.
        assert_eq!(parse(b"HELF\x1c\0\0\0"), Err(ProxyError::NotProxy));
        assert_eq!(parse(b"\r\n\r\nX"), Err(ProxyError::NotProxy));
        let mut v3 = v4(1, &[]);
        v3[12] = 0x31;
        assert_eq!(parse(&v3), Err(ProxyError::Version(3)));
        let mut cmd = v4(1, &[]);
        cmd[12] = 0x25;
        assert_eq!(parse(&cmd), Err(ProxyError::Command(5)));
        let mut short = v4(1, &[]);
        short[15] = 4; // an IPv4 block of 4 bytes
        short.truncate(20);
        assert_eq!(parse(&short), Err(ProxyError::Length(4)));
        let mut long = v4(1, &[]);
        long[14] = 0xff;
        assert_eq!(parse(&long), Err(ProxyError::Length(0xff0c)));
        // Every byte flipped: an error or a header, never a panic.
        let good = v4(1, &[1, 2, 3]);
        for i in 0..good.len() {
            let mut b = good.clone();
            b[i] ^= 0xff;
            let _ = parse(&b);
        }
    }
}
