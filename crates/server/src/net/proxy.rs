//! Reads the PROXY protocol v2 header ([`crate::endpoint::proxy`]) off a
//! socket: exactly the header, nothing of the Hello.

pub use crate::endpoint::proxy::*;

/// Reads exactly one header from `stream` (nothing after it).
pub async fn read<R: tokio::io::AsyncRead + Unpin>(stream: &mut R) -> std::io::Result<ProxyHeader> {
    use tokio::io::AsyncReadExt;
    let invalid = |e: ProxyError| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
    let mut head = [0u8; FIXED_LEN];
    stream.read_exact(&mut head).await?;
    let len = body_len(&head).map_err(invalid)?;
    let mut body = vec![0u8; len];
    stream.read_exact(&mut body).await?;
    header(&head, &body).map_err(invalid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::endpoint::proxy::tests::v4;

    #[test]
    fn read_takes_exactly_the_header() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let mut b = v4(1, &[]);
        b.extend_from_slice(b"HELrest");
        let mut cursor = std::io::Cursor::new(b);
        let h = rt.block_on(read(&mut cursor)).unwrap();
        assert_eq!(h.source().unwrap().port(), 50000);
        assert_eq!(cursor.position(), 28, "the Hello is left unread");
        let mut bad = std::io::Cursor::new(b"HELF\x1c\0\0\0xxxxxxxxxxxxxxxx".to_vec());
        let e = rt.block_on(read(&mut bad)).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidData);
    }
}
