//! A peer OPC UA server on the crates.io `async-opcua` stack, for
//! `bench/compare.sh` only.
//!
//! usage: async-opcua-peer PORT PKI_DIR [--secure]
//!
//! Serves SecurityPolicy None with anonymous identity on 127.0.0.1:PORT
//! (with `--secure` also Basic256Sha256 SignAndEncrypt, with a key pair
//! async-opcua creates in PKI_DIR and every client certificate trusted, for
//! `bench/session_table.sh --peers`),
//! namespace 0 (the generated core address space, so `i=2258`
//! Server_ServerStatus_CurrentTime is computed per read) plus one writable
//! Double variable `Temperature` (20.5) under Objects, with the string NodeId
//! "Temperature" in the namespace this server registers for it (index 2:
//! async-opcua keeps 1 for its application URI; `READY ns=N` prints it). Limits are
//! raised so that 10 connections x 100 Reads in flight, Reads of 100+ values
//! and some thousand sessions are accepted. Prints `READY ns=<index>` once the
//! listener is bound and runs until stdin closes.

#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;

use opcua::server::address_space::VariableBuilder;
use opcua::server::diagnostics::NamespaceMetadata;
use opcua::server::node_manager::memory::{simple_node_manager, SimpleNodeManager};
use opcua::server::{ServerBuilder, ServerEndpoint, ANONYMOUS_USER_TOKEN_ID};
use opcua::types::{DataTypeId, NodeId, ObjectId};
use tokio::io::AsyncReadExt;

const NAMESPACE_URI: &str = "urn:uascale:bench:async-opcua-peer";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (port, pki_dir, secure) = match args.as_slice() {
        [_, port, pki, rest @ ..] if rest.is_empty() || rest == ["--secure"] => {
            match port.parse::<u16>() {
                Ok(p) => (p, pki.clone(), !rest.is_empty()),
                Err(_) => {
                    eprintln!("async-opcua-peer: PORT {port:?} is not a port number");
                    return ExitCode::from(2);
                }
            }
        }
        _ => {
            eprintln!("usage: async-opcua-peer PORT PKI_DIR [--secure]");
            return ExitCode::from(2);
        }
    };
    // The default multi-thread runtime: under `taskset -c 0` it has one
    // worker, as a user of the library would get.
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("async-opcua-peer: cannot start the tokio runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(serve(port, pki_dir, secure)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("async-opcua-peer: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(port: u16, pki_dir: String, secure: bool) -> Result<(), String> {
    let anonymous = [ANONYMOUS_USER_TOKEN_ID.to_string()];
    let mut builder = ServerBuilder::new()
        .application_name("async-opcua bench peer")
        .application_uri("urn:uascale:bench:async-opcua-peer:app")
        .product_uri("urn:uascale:bench:async-opcua-peer")
        .pki_dir(pki_dir)
        .create_sample_keypair(secure)
        .trust_client_certs(secure)
        .host("127.0.0.1")
        .port(port)
        .add_endpoint("none", ServerEndpoint::new_none("/", &anonymous))
        .discovery_urls(vec!["/".to_owned()])
        .max_sessions(20_000)
        .max_session_timeout_ms(3_600_000)
        .with_node_manager(simple_node_manager(
            NamespaceMetadata {
                namespace_uri: NAMESPACE_URI.to_owned(),
                ..Default::default()
            },
            "bench",
        ));
    if secure {
        builder = builder.add_endpoint(
            "basic256sha256_sign_encrypt",
            ServerEndpoint::new_basic256sha256_sign_encrypt("/", &anonymous),
        );
    }
    {
        let limits = builder.limits_mut();
        limits.operational.max_nodes_per_read = 10_000;
        limits.max_array_length = 100_000;
    }
    let (server, handle) = builder.build()?;

    let ns = handle
        .get_namespace_index(NAMESPACE_URI)
        .ok_or("the bench namespace was not registered")?;
    let manager: Arc<SimpleNodeManager> = handle
        .node_managers()
        .get_of_type::<SimpleNodeManager>()
        .ok_or("the simple node manager is missing")?;
    {
        let mut space = manager.address_space().write();
        let inserted = VariableBuilder::new(
            &NodeId::new(ns, "Temperature"),
            "Temperature",
            "Temperature",
        )
        .data_type(DataTypeId::Double)
        .value(20.5f64)
        .writable()
        .organized_by(ObjectId::ObjectsFolder)
        .insert(&mut *space);
        if !inserted {
            return Err("could not insert the Temperature variable".to_owned());
        }
    }

    // Bind ourselves (backlog 4096, as uascale does) so READY means the
    // port accepts connections.
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let socket = tokio::net::TcpSocket::new_v4().map_err(|e| format!("socket: {e}"))?;
    socket
        .set_reuseaddr(true)
        .map_err(|e| format!("SO_REUSEADDR: {e}"))?;
    socket
        .bind(addr)
        .map_err(|e| format!("cannot bind {addr}: {e}"))?;
    let listener = socket
        .listen(4096)
        .map_err(|e| format!("cannot listen on {addr}: {e}"))?;

    let mut server_task = tokio::spawn(server.run_with(listener));
    println!("READY ns={ns}");

    // Run until stdin closes (the driving script ends us that way or by
    // PID), or until the server stops on its own.
    let mut stdin = tokio::io::stdin();
    let mut buf = [0u8; 256];
    loop {
        tokio::select! {
            r = stdin.read(&mut buf) => match r {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            },
            r = &mut server_task => {
                return match r {
                    Ok(Ok(())) => Err("the server stopped".to_owned()),
                    Ok(Err(e)) => Err(format!("the server failed: {e}")),
                    Err(e) => Err(format!("the server task failed: {e}")),
                };
            }
        }
    }
    handle.cancel();
    match server_task.await {
        Ok(r) => r,
        Err(e) => Err(format!("the server task failed: {e}")),
    }
}
