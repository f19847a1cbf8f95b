//! Real external processes the cluster tests start and stop.

#![allow(dead_code)] // each test binary uses part of it

pub mod haproxy;
pub mod nats;
