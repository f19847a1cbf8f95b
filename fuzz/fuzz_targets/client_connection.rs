//! Any byte stream from a server, split at arbitrary points and mixed with
//! timer ticks, fed to a client connection after its Hello: the client
//! never panics, and once closed stays closed. When the stream opens the
//! channel, a request is sent so that the rest reaches response handling.
#![no_main]

use std::sync::Arc;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use uascale_proto::{ClientConfig, ClientConnection, Now};
use uascale_types::DateTime;

fuzz_target!(|data: &[u8]| {
    let Some((&split, rest)) = data.split_first() else {
        return;
    };
    let origin = Instant::now();
    let mut now = Now {
        instant: origin,
        utc: DateTime::from_ticks(133_590_384_000_000_000),
    };
    let config = ClientConfig {
        endpoint_url: "opc.tcp://localhost:4840".to_owned(),
        ..ClientConfig::default()
    };
    let mut conn = ClientConnection::new(now, Arc::new(config));
    let mut out = Vec::new();
    // The Hello.
    conn.poll_transmit(&mut out);
    out.clear();
    let step = usize::from(split).max(1);
    let mut input = Vec::new();
    let mut sent = false;
    for piece in rest.chunks(step) {
        input.extend_from_slice(piece);
        let was_closed = conn.is_closed();
        let _ = conn.handle_input(now, &mut input);
        assert!(!was_closed || conn.is_closed());
        while conn.poll_event().is_some() {}
        if conn.is_open() && !sent {
            // A ReadRequest's encoding id and an empty body: the channel
            // layer does not look inside.
            let _ = conn.send_request(&[0x01, 0x00, 0x77, 0x02]);
            sent = true;
        }
        while conn.poll_transmit(&mut out) {
            out.clear();
        }
        out.clear();
        now.instant += Duration::from_millis(u64::from(piece[0]) * 20);
        if conn.poll_timeout().is_some_and(|t| t <= now.instant) {
            conn.handle_timeout(now);
        }
    }
});
