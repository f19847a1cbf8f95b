//! The metrics and health endpoint's listener (`[metrics] listen`): reads
//! one request head per connection, bounded in size, time and count, and
//! writes the answer [`crate::endpoint::probes`] gives.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::endpoint::probes::{
    find_end, respond, Response, IO_TIMEOUT, MAX_CONNECTIONS, MAX_REQUEST,
};
use crate::state::ServerState;

/// Serves the endpoint on `listener` until the task is aborted (which
/// aborts the requests being served with it).
pub(super) async fn serve(listener: TcpListener, state: Arc<ServerState>) {
    let permits = Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        while tasks.try_join_next().is_some() {}
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(e) => {
                tracing::debug!(error = %e, "metrics endpoint: accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            tracing::debug!(%peer, "metrics endpoint busy: connection closed");
            continue;
        };
        let state = Arc::clone(&state);
        tasks.spawn(async move {
            handle(stream, peer, &state).await;
            drop(permit);
        });
    }
}

/// Why no request head was read.
#[derive(Debug, PartialEq, Eq)]
enum HeadError {
    /// Over [`MAX_REQUEST`] bytes without the blank line.
    TooLarge,
    /// The peer closed or the read failed.
    Closed,
}

/// Reads up to the blank line that ends the request head.
async fn read_head(stream: &mut TcpStream) -> Result<Vec<u8>, HeadError> {
    let mut head = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    loop {
        let n = stream.read(&mut buf).await.map_err(|_| HeadError::Closed)?;
        if n == 0 {
            return Err(HeadError::Closed);
        }
        // Search from just before the new bytes (the terminator may span
        // two reads).
        let from = head.len().saturating_sub(3);
        head.extend_from_slice(&buf[..n]);
        if let Some(end) = find_end(&head[from..]) {
            head.truncate(from + end);
            return Ok(head);
        }
        if head.len() > MAX_REQUEST {
            return Err(HeadError::TooLarge);
        }
    }
}

async fn handle(mut stream: TcpStream, peer: SocketAddr, state: &Arc<ServerState>) {
    let response = match tokio::time::timeout(IO_TIMEOUT, read_head(&mut stream)).await {
        Err(_) => Response::text(408, "Request Timeout", "no request within 5 s\n"),
        Ok(Err(HeadError::TooLarge)) => Response::text(
            431,
            "Request Header Fields Too Large",
            "request head over 8 KiB\n",
        ),
        Ok(Err(HeadError::Closed)) => return,
        Ok(Ok(head)) => respond(&head, state),
    };
    tracing::debug!(%peer, status = response.status, "metrics endpoint answered");
    let bytes = response.to_bytes();
    let _ = tokio::time::timeout(IO_TIMEOUT, async {
        stream.write_all(&bytes).await?;
        stream.shutdown().await
    })
    .await;
}
