//! Any sequence of chunk operations on two assemblers sharing one budget:
//! no panic, the budget never goes over its total, and it returns to zero
//! when both assemblers are gone.
#![no_main]

use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use uascale_proto::reassembly::{AssemblyLimits, Assembler, ReassemblyBudget};
use uascale_proto::tcp::ChunkType;

fuzz_target!(|data: &[u8]| {
    let budget = ReassemblyBudget::new(4096, 25);
    let limits = AssemblyLimits {
        max_message_size: Some(2048),
        max_chunk_count: Some(16),
        max_in_progress: 3,
        deadline: Duration::from_secs(1),
    };
    let mut a = [Assembler::new(limits, budget.clone()), Assembler::new(limits, budget.clone())];
    let mut now = Instant::now();
    for op in data.chunks(3) {
        let [kind, id, len] = [op[0], *op.get(1).unwrap_or(&0), *op.get(2).unwrap_or(&0)];
        let which = usize::from(kind & 1);
        let chunk_type = match (kind >> 1) % 4 {
            0 => ChunkType::Final,
            1 | 2 => ChunkType::Intermediate,
            _ => ChunkType::Abort,
        };
        let body = vec![0u8; usize::from(len) * 4];
        let _ = a[which].push(now, u32::from(id % 5), chunk_type, &body, kind & 0x80 != 0);
        assert!(budget.used() <= 4096);
        if kind & 0x40 != 0 {
            now += Duration::from_millis(300);
            a[which].handle_timeout(now);
        }
    }
    drop(a);
    assert_eq!(budget.used(), 0);
});
