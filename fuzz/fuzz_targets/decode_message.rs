//! Any bytes as a service message body: decoding must not panic, and what
//! decodes must re-encode to bytes that decode to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uascale_types::{decode_message, encode_message, DecodeLimits, Reader};

fuzz_target!(|data: &[u8]| {
    let limits = DecodeLimits {
        max_message_size: 1 << 20,
        ..DecodeLimits::default()
    };
    let Ok(mut r) = Reader::new(data, &limits) else {
        return;
    };
    if let Ok(msg) = decode_message(&mut r) {
        let mut again = Vec::new();
        encode_message(msg.as_ref(), &mut again);
        let mut r2 = Reader::new(&again, &limits).expect("re-encoded message within limits");
        let back = decode_message(&mut r2).expect("re-encoded message decodes");
        // NaN payloads compare unequal to themselves; compare encodings then.
        let mut third = Vec::new();
        encode_message(back.as_ref(), &mut third);
        assert_eq!(again, third, "encoding is not stable");
    }
});
