//! Any bytes as the start of an opc.https request: the HTTP/1.1 head
//! parser, then the judgement of a parsed head, then the peek at a body's
//! encoding id and header - no panic; a parsed head never claims more
//! bytes than it was given, and a judged body length stays within the
//! limit.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uascale_server::endpoint::https::{judge, parse_head, peek};
use uascale_types::DecodeLimits;

fuzz_target!(|data: &[u8]| {
    let limit = 4096;
    if let Ok(Some((head, len))) = parse_head(data) {
        assert!(len <= data.len(), "head of {len} bytes in {}", data.len());
        if let Ok(body_len) = judge(&head, limit) {
            assert!((1..=limit).contains(&body_len));
        }
        let body = data.get(len..).unwrap_or_default();
        let _ = peek(body, &DecodeLimits::default());
    }
    let _ = peek(data, &DecodeLimits::default());
});
