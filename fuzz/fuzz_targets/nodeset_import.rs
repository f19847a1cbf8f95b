//! Any bytes as a NodeSet2 XML document through the nodeset loader (what
//! `serve --nodeset` reads): no panic, whatever the document.
//!
//! The loader writes into a copy of namespace 0 (built once) each run:
//! what the server loads companion models into, where the seeds'
//! RequiredModel and references point; after a server's two standard
//! namespaces.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use uascale_server::address_space::AddressSpace;
use uascale_server::node_manager::NodeManagers;
use uascale_server::nodeset::Loader;

fuzz_target!(|data: &[u8]| {
    let Ok(xml) = std::str::from_utf8(data) else {
        return;
    };
    static NS0: OnceLock<AddressSpace> = OnceLock::new();
    let mut space = NS0
        .get_or_init(|| AddressSpace::ns0().expect("ns0"))
        .clone();
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
