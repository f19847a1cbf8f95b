//! The request lifecycle on simulated time, with no sockets.
