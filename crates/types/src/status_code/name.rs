//! A StatusCode's symbolic name and description, from the generated table,
//! and its `Display` / `Debug` through them. Kept apart from the type: the
//! generated table names the type, and this reads the table.

use std::fmt;

use crate::generated::status_codes;
use crate::status_code::StatusCode;

impl StatusCode {
    /// The symbolic name of the code (ignoring info bits), when known.
    pub fn name(self) -> Option<&'static str> {
        status_codes::name_of(self.0 & 0xffff_0000)
    }

    /// The code with the given symbolic name, e.g. `"BadNodeIdUnknown"`.
    pub fn from_name(name: &str) -> Option<StatusCode> {
        status_codes::from_name(name)
    }

    /// The description from the specification, when known.
    pub fn description(self) -> Option<&'static str> {
        status_codes::description_of(self.0 & 0xffff_0000)
    }
}

impl fmt::Display for StatusCode {
    /// The name, plus the info bits in hex when any are set; or the hex value.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(n) if self.0 & 0xffff == 0 => f.write_str(n),
            Some(n) => write!(f, "{n}+0x{:04x}", self.0 & 0xffff),
            None => write!(f, "0x{:08x}", self.0),
        }
    }
}

impl fmt::Debug for StatusCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
