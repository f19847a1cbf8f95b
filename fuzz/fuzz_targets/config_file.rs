//! Any bytes as the TOML configuration file `serve --config` reads: parsing
//! into a ServerConfig, resolving the automatic values and validating must
//! not panic, whatever the text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uascale_server::ServerConfig;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let Ok(config) = toml::from_str::<ServerConfig>(text) else {
        return;
    };
    for cpus in [1, 2, 64] {
        let resolved = config.resolved(cpus);
        let _ = resolved.validate();
    }
});
