//! Any bytes as the start of an opc.https request: the HTTP/1.1 head
//! parser, then the judgement of a parsed head, then the peek at a body's
//! encoding id and header, and the same bytes as an HTTP/2 stream's
//! headers (the head made of them, judged) - no panic; a parsed head never claims more
//! bytes than it was given, and a judged body length stays within the
//! limit.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uascale_server::endpoint::https::{head_of_stream, judge, parse_head, peek};
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
    // The same bytes as an HTTP/2 stream's headers, one `name:value` a
    // line (a value that is not UTF-8 as h2 would hand it: none).
    let headers: Vec<(&str, Option<&str>)> = data
        .split(|b| *b == b'\n')
        .filter_map(|line| {
            let at = line.iter().position(|b| *b == b':')?;
            let name = std::str::from_utf8(line.get(..at)?).ok()?;
            Some((
                name,
                line.get(at + 1..).and_then(|v| std::str::from_utf8(v).ok()),
            ))
        })
        .collect();
    if let Ok(head) = head_of_stream("POST", "/", &headers) {
        if let Ok(body_len) = judge(&head, limit) {
            assert!((1..=limit).contains(&body_len));
        }
    }
});
