//! Any byte stream from a client, split at arbitrary points and mixed with
//! timer ticks: the server connection never panics, consumes only whole
//! messages, and once closed stays closed.
#![no_main]

use std::sync::Arc;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use uascale_proto::reassembly::ReassemblyBudget;
use uascale_proto::{ChannelConfig, Now, PendingConnection};
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
    let budget = ReassemblyBudget::new(64 * 1024, 50);
    let mut conn = PendingConnection::new().accept(now, 1, Arc::new(ChannelConfig::default()), budget);
    let step = usize::from(split).max(1);
    let mut input = Vec::new();
    let mut out = Vec::new();
    for piece in rest.chunks(step) {
        input.extend_from_slice(piece);
        let was_closed = conn.is_closed();
        let _ = conn.handle_input(now, &mut input);
        assert!(!was_closed || conn.is_closed());
        while conn.poll_event().is_some() {}
        conn.poll_transmit(&mut out);
        out.clear();
        now.instant += Duration::from_millis(u64::from(piece[0]) * 20);
        if conn.poll_timeout().is_some_and(|t| t <= now.instant) {
            conn.handle_timeout(now);
        }
    }
});
