//! Any text as a NodeId / ExpandedNodeId: parsing must not panic, and what
//! parses prints to text that parses to the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uascale_types::{ExpandedNodeId, NodeId};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(n) = text.parse::<NodeId>() {
        let printed = n.to_string();
        assert_eq!(printed.parse::<NodeId>().as_ref(), Ok(&n), "{printed}");
    }
    if let Ok(n) = text.parse::<ExpandedNodeId>() {
        let printed = n.to_string();
        assert_eq!(printed.parse::<ExpandedNodeId>().as_ref(), Ok(&n), "{printed}");
    }
});
