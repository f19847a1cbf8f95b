//! Any bytes as a NodeSet2 XML document through the nodeset loader (what
//! `serve --nodeset` reads): no panic, whatever the document.
//!
//! The loader writes into an empty address space each run (building ns0
//! per run would cost more than the load itself), after a server's two
//! standard namespaces.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uascale_server::address_space::AddressSpace;
use uascale_server::node_manager::NodeManagers;
use uascale_server::nodeset::Loader;

fuzz_target!(|data: &[u8]| {
    let Ok(xml) = std::str::from_utf8(data) else {
        return;
    };
    let mut space = AddressSpace::default();
    let mut loader = Loader::new(
        &mut space,
        vec![
            "http://opcfoundation.org/UA/".to_owned(),
            "urn:uascale:fuzz".to_owned(),
        ],
    );
    let _ = loader.load_str(xml, "fuzz.xml");
    // A second document after the first (namespace mapping, duplicates).
    let _ = loader.load_str(xml, "again.xml");
    let mut managers = NodeManagers::default();
    loader.finish(&mut managers);
});
