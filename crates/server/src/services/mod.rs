//! The services, one module per Part 4 service set. Each handler takes the
//! request's [`ServiceContext`](crate::context::ServiceContext) and its
//! decoded request and returns `Result<Response, ServiceError>`; the
//! dispatcher ([`crate::dispatch`]) routes to them and turns errors into
//! ServiceFaults.

pub mod attribute;
pub mod discovery;
pub mod method;
pub mod monitored_item;
pub mod session;
pub mod subscription;
pub mod view;
