//! The client commands: `endpoints`, `browse`, `read`, `write`, `call`
//! (and the start of `subscribe`, which lives in `subscribe.rs`).

use std::process::ExitCode;
use std::time::Duration;

use serde_json::{json, Value as Json};
use uascale_client::{Client, ClientError, ClientOptions};
use uascale_types as t;
use uascale_types::{NodeId, StatusCode, Variant, VariantType};

use crate::client_common::{node, outln, Common, Failure};
use crate::client_security::{parse_security, user_identity, SecurityArgs};
use crate::values;

pub const USAGE: &str = "       uascale endpoints URL [--json]
       uascale browse URL [NODE] [--depth N] [--json]
       uascale read URL NODE... [--attr NAME] [--json]
       uascale write URL NODE VALUE [--type TYPE] [--json]
       uascale call URL OBJECT METHOD [ARG...] [--json]
       uascale shutdown URL [--delay S] [--reason TEXT] [--return-at TIME] [--cancel]
       uascale subscribe URL [NODE...] [--events NOTIFIER] [--fields F,F,...]
                         [--min-severity N] [--interval-ms MS] [--sampling-ms MS]
                         [--count N] [--duration-s S] [--json]

  client options (every client command; --timeout-ms MS):
    --security POLICY[:MODE]  secure channel, e.g. Basic256Sha256:SignAndEncrypt,
             aes256:Sign. POLICY (case-insensitive): None, Basic256Sha256 (b256),
             Aes128_Sha256_RsaOaep (aes128), Aes256_Sha256_RsaPss (aes256),
             ECC_nistP256, ECC_nistP384, ECC_curve25519, ECC_nistP256_AesGcm,
             ECC_nistP256_ChaChaPoly (an ECC policy uses the client certificate
             of its curve, created on first use like the RSA one); MODE Sign or
             SignAndEncrypt (the default). Basic256 and Basic128Rsa15 are
             deprecated and not supported
    --pki DIR        client PKI (default ./pki-client): own/ holds the client
             certificate (created on first use, urn:uascale:client), trusted/
             the server certificates trusted; untrusted ones go to rejected/
    --trust-server   accept any server certificate (UNSAFE: no protection
             against a server impersonator)
    --user NAME      user name identity; the password comes from the
             UASCALE_PASSWORD environment variable (or --password, visible
             to other local users)
    --cert FILE --key FILE  X.509 user identity (certificate, PEM key)
  client commands:
  endpoints  the server's endpoints with their security and token policies
  browse     the tree below NODE (default i=85, Objects), --depth levels (1)
  read       attribute NAME (default Value) of each NODE
  write      VALUE (text; [a, b] for arrays) typed by the node's DataType,
             or by --type (Boolean, Int32, Double, String, DateTime, ...)
  call       METHOD on OBJECT, ARGs typed by the method's InputArguments
  shutdown   asks the server to shut down in --delay seconds (default 5)
             for --reason (Server.RequestServerStateChange; the user, given
             with --user or --cert, must be in the server's
             server.admin_users); --return-at is the expected return
             (RFC 3339, e.g. 2026-01-31T12:00:00Z); --cancel cancels a
             planned shutdown instead
  subscribe  data changes of each NODE and/or the events of NOTIFIER (i=2253
             is the Server object) as they come, one line each (--json: one
             JSON object per line); event --fields by browse name (default
             Time,SourceName,Severity,Message), --min-severity filters on
             the server; publishing every --interval-ms (500), sampling
             every --sampling-ms (the publishing interval); ends on Ctrl-C,
             after --count notifications or --duration-s seconds; a lost
             connection is reopened and the subscription kept
  NODE is OPC UA text: i=2258, ns=2;s=Demo.Dynamic.Counter, g=..., b=...";

/// The security flags every client command takes (each with a value).
const SECURITY_FLAGS: &[&str] = &[
    "--security",
    "--pki",
    "--user",
    "--password",
    "--cert",
    "--key",
];

fn parse_common(args: &[&str], flags_with_value: &[&str]) -> Result<Common, String> {
    let mut url = None;
    let mut json = false;
    let mut trust_server = false;
    let mut timeout = Duration::from_secs(10);
    let mut rest = Vec::new();
    let mut named = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match *a {
            "--json" => json = true,
            "--trust-server" => trust_server = true,
            "--timeout-ms" => {
                let v = it.next().ok_or("--timeout-ms needs a value")?;
                let ms: u64 = v
                    .parse()
                    .map_err(|_| format!("--timeout-ms {v:?} is not a number"))?;
                timeout = Duration::from_millis(ms);
            }
            f if flags_with_value.contains(&f) || SECURITY_FLAGS.contains(&f) => {
                let v = it.next().ok_or_else(|| format!("{f} needs a value"))?;
                named.push((f.to_owned(), (*v).to_owned()));
            }
            f if f.starts_with("--") => return Err(format!("unknown option {f:?}")),
            positional if url.is_none() => url = Some(positional.to_owned()),
            positional => rest.push(positional.to_owned()),
        }
    }
    let url = url.ok_or("the server URL is missing (e.g. opc.tcp://localhost:4840)")?;
    Ok(Common {
        url,
        json,
        trust_server,
        timeout,
        rest,
        named,
    })
}

impl Common {
    /// Client options from the security and identity flags.
    fn client_options(&self) -> Result<ClientOptions, String> {
        let (policy, mode) = match self.flag("--security") {
            Some(s) => parse_security(s)?,
            None => parse_security("None")?,
        };
        let args = SecurityArgs {
            policy,
            mode,
            pki: self.flag("--pki").unwrap_or("pki-client").into(),
            trust_any: self.trust_server,
        };
        Ok(ClientOptions {
            request_timeout: self.timeout,
            connect_timeout: self.timeout,
            security: args.options_for(&self.url)?,
            identity: user_identity(
                self.flag("--user"),
                self.flag("--password"),
                self.flag("--cert"),
                self.flag("--key"),
            )?,
            ..Default::default()
        })
    }
}

/// A message for a failure, with what to do about it.
fn explain(url: &str, pki: &str, e: &ClientError) -> String {
    match e {
        ClientError::Channel { status, .. } if *status == StatusCode::BadCertificateUntrusted => {
            format!(
                "{e}\n  the server does not trust our certificate ({pki}/own/certs/cert.der); \
                 the server keeps it in its PKI's rejected/certs: on the server, \
                 `uascale cert list --pki SERVER_PKI` shows it and \
                 `uascale cert trust THUMBPRINT --pki SERVER_PKI` trusts it"
            )
        }
        ClientError::EndpointNotFound { .. } => format!(
            "{e}\n  pick one of these with --security POLICY:MODE (`uascale endpoints {url}`)"
        ),
        ClientError::Io(_) => {
            format!("{e}\n  is the server running, and is {url} the right host and port?")
        }
        ClientError::Timeout => format!(
            "{e}\n  the server at {url} did not answer; is it overloaded or behind a firewall?"
        ),
        ClientError::Channel { status, .. }
            if *status == StatusCode::BadSecurityPolicyRejected
                || *status == StatusCode::BadCertificateUntrusted =>
        {
            format!(
                "{e}\n  the server refuses this security configuration; `uascale endpoints {url}` lists what it offers"
            )
        }
        ClientError::Channel {
            retry_after_ms: Some(ms),
            ..
        } => format!("{e}\n  the server is busy; retry in {ms} ms"),
        _ => e.to_string(),
    }
}

/// Runs `uascale CMD ARGS...`.
pub fn run(cmd: &str, args: &[&str]) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("uascale {cmd}: cannot start the runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let with_value: &[&str] = match cmd {
        "browse" => &["--depth"],
        "read" => &["--attr"],
        "write" => &["--type"],
        "subscribe" => crate::subscribe::FLAGS,
        "shutdown" => &["--delay", "--reason", "--return-at"],
        _ => &[],
    };
    // `shutdown --cancel` is the one flag without a value.
    let cancel = cmd == "shutdown" && args.contains(&"--cancel");
    let args: Vec<&str> = args
        .iter()
        .copied()
        .filter(|a| !(cancel && *a == "--cancel"))
        .collect();
    let common = match parse_common(&args, with_value) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("uascale {cmd}: {e}\n(uascale --help for usage)");
            return ExitCode::from(2);
        }
    };
    let url = common.url.clone();
    let pki = common.flag("--pki").unwrap_or("pki-client").to_owned();
    let result = runtime.block_on(async {
        let options = common.client_options().map_err(Failure::Usage)?;
        let client = Client::connect(&common.url, options)
            .await
            .map_err(|e| Failure::Client(explain(&url, &pki, &e)))?;
        let out = match cmd {
            "endpoints" => endpoints(&client, &common).await,
            "browse" => {
                client.create_session("uascale browse").await?;
                browse(&client, &common).await
            }
            "read" => {
                client.create_session("uascale read").await?;
                read(&client, &common).await
            }
            "write" => {
                client.create_session("uascale write").await?;
                write(&client, &common).await
            }
            "call" => {
                client.create_session("uascale call").await?;
                call(&client, &common).await
            }
            "subscribe" => {
                client.create_session("uascale subscribe").await?;
                crate::subscribe::subscribe(&client, &common).await
            }
            "shutdown" => {
                client.create_session("uascale shutdown").await?;
                shutdown(&client, &common, cancel).await
            }
            _ => Err(Failure::Usage(format!("unknown command {cmd:?}"))),
        };
        client.close().await;
        out
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(e)) => {
            eprintln!("uascale {cmd}: {e}\n(uascale --help for usage)");
            ExitCode::from(2)
        }
        Err(Failure::Client(e)) => {
            eprintln!("uascale {cmd}: {e}");
            ExitCode::FAILURE
        }
        Err(Failure::Bad(e)) => {
            eprintln!("uascale {cmd}: {e}");
            ExitCode::FAILURE
        }
    }
}

fn print_json(v: &Json) {
    outln!("{}", serde_json::to_string_pretty(v).unwrap_or_default());
}

async fn endpoints(client: &Client, c: &Common) -> Result<(), Failure> {
    let eps = client.get_endpoints().await?;
    if c.json {
        let list: Vec<Json> = eps
            .iter()
            .map(|e| {
                json!({
                    "url": e.endpoint_url.as_str(),
                    "security_policy": e.security_policy_uri.as_str(),
                    "security_mode": format!("{:?}", e.security_mode),
                    "security_level": e.security_level,
                    "user_tokens": e.user_identity_tokens.iter().flatten().map(|p| json!({
                        "policy_id": p.policy_id.as_str(),
                        "type": format!("{:?}", p.token_type),
                        "security_policy": p.security_policy_uri.as_str(),
                    })).collect::<Vec<_>>(),
                })
            })
            .collect();
        print_json(&Json::Array(list));
        return Ok(());
    }
    for e in &eps {
        let policy = e
            .security_policy_uri
            .as_str()
            .unwrap_or("")
            .rsplit('#')
            .next()
            .unwrap_or("");
        outln!(
            "{}  {} / {:?}  (level {})",
            e.endpoint_url,
            policy,
            e.security_mode,
            e.security_level
        );
        for p in e.user_identity_tokens.iter().flatten() {
            outln!("    token {:?} ({})", p.token_type, p.policy_id);
        }
    }
    Ok(())
}

async fn browse(client: &Client, c: &Common) -> Result<(), Failure> {
    let start = match c.rest.first() {
        Some(n) => node(n).map_err(Failure::Usage)?,
        None => NodeId::ns0(85),
    };
    let depth: usize = match c.flag("--depth") {
        Some(d) => d
            .parse()
            .map_err(|_| Failure::Usage(format!("--depth {d:?} is not a number")))?,
        None => 1,
    };
    let children = |n: NodeId| async move {
        client
            .browse(t::BrowseDescription {
                node_id: n.clone(),
                browse_direction: t::BrowseDirection::Forward,
                reference_type_id: NodeId::ns0(33),
                include_subtypes: true,
                node_class_mask: 0,
                result_mask: 63,
            })
            .await
            .map_err(|e| Failure::Bad(format!("browse {n}: {e}")))
    };
    // Depth-first, printed in pre-order; each node is expanded once.
    let mut out = Vec::new();
    let mut seen = std::collections::HashSet::new();
    seen.insert(start.clone());
    let mut stack: Vec<(usize, t::ReferenceDescription)> = Vec::new();
    if depth > 0 {
        for r in children(start).await?.into_iter().rev() {
            stack.push((0, r));
        }
    }
    while let Some((level, r)) = stack.pop() {
        let target = r.node_id.node_id.clone();
        let expand =
            level + 1 < depth && r.node_id.server_index == 0 && seen.insert(target.clone());
        out.push((level, r));
        if expand {
            for c in children(target).await?.into_iter().rev() {
                stack.push((level + 1, c));
            }
        }
    }
    if c.json {
        let list: Vec<Json> = out
            .iter()
            .map(|(level, r)| {
                json!({
                    "depth": level + 1,
                    "node": r.node_id.to_string(),
                    "browse_name": r.browse_name.to_string(),
                    "display_name": r.display_name.text.as_str(),
                    "node_class": format!("{:?}", r.node_class),
                })
            })
            .collect();
        print_json(&Json::Array(list));
    } else {
        for (level, r) in &out {
            outln!(
                "{}{} ({:?}) {}",
                "  ".repeat(*level),
                r.browse_name,
                r.node_class,
                r.node_id
            );
        }
    }
    Ok(())
}

async fn read(client: &Client, c: &Common) -> Result<(), Failure> {
    if c.rest.is_empty() {
        return Err(Failure::Usage("no NODE to read".into()));
    }
    let attr = match c.flag("--attr") {
        None => t::AttributeId::Value,
        Some(name) => attribute_by_name(name).ok_or_else(|| {
            Failure::Usage(format!(
                "--attr {name:?} is not an attribute (Value, DisplayName, DataType, ...)"
            ))
        })?,
    };
    let nodes = c.nodes()?;
    let values = client
        .read(
            nodes
                .iter()
                .map(|n| t::ReadValueId {
                    node_id: n.clone(),
                    attribute_id: attr as u32,
                    ..Default::default()
                })
                .collect(),
            t::TimestampsToReturn::Both,
        )
        .await?;
    let mut bad = false;
    if c.json {
        print_json(&Json::Array(
            nodes
                .iter()
                .zip(&values)
                .map(|(n, dv)| values::data_value_json(n, dv))
                .collect(),
        ));
    }
    for (n, dv) in nodes.iter().zip(&values) {
        let status = dv.status.unwrap_or(StatusCode::Good);
        bad |= status.is_bad();
        if !c.json {
            match &dv.value {
                Some(v) if !status.is_bad() => outln!("{n} = {}", values::text(v)),
                _ => outln!("{n}: {status}"),
            }
        }
    }
    if bad {
        return Err(Failure::Bad("some values could not be read".into()));
    }
    Ok(())
}

fn attribute_by_name(name: &str) -> Option<t::AttributeId> {
    (1..=27u32)
        .filter_map(t::AttributeId::from_u32)
        .find(|a| format!("{a:?}").eq_ignore_ascii_case(name))
}

/// The built-in type to parse a value for `node` as: `--type`, else its
/// DataType, else the type of its current value.
async fn value_type(
    client: &Client,
    node: &NodeId,
    forced: Option<&str>,
) -> Result<VariantType, Failure> {
    if let Some(name) = forced {
        return values::type_by_name(name)
            .ok_or_else(|| Failure::Usage(format!("--type {name:?} is not a built-in type")));
    }
    let got = client
        .read(
            vec![
                t::ReadValueId {
                    node_id: node.clone(),
                    attribute_id: t::AttributeId::DataType as u32,
                    ..Default::default()
                },
                t::ReadValueId {
                    node_id: node.clone(),
                    attribute_id: t::AttributeId::Value as u32,
                    ..Default::default()
                },
            ],
            t::TimestampsToReturn::Neither,
        )
        .await?;
    if let Some(s) = got.first().and_then(|d| d.status).filter(|s| s.is_bad()) {
        return Err(Failure::Bad(format!("{node}: {s}")));
    }
    let from_data_type = match got.first().and_then(|d| d.value.as_ref()) {
        Some(Variant::NodeId(dt)) => values::builtin_of(dt),
        _ => None,
    };
    let from_value = got
        .get(1)
        .and_then(|d| d.value.as_ref())
        .and_then(Variant::type_id);
    from_data_type.or(from_value).ok_or_else(|| {
        Failure::Usage(format!(
            "cannot tell the type of {node}'s values; give it with --type"
        ))
    })
}

async fn write(client: &Client, c: &Common) -> Result<(), Failure> {
    let [n, text] = c.rest.as_slice() else {
        return Err(Failure::Usage("write needs NODE and VALUE".into()));
    };
    let n = node(n).map_err(Failure::Usage)?;
    let ty = value_type(client, &n, c.flag("--type")).await?;
    let value = values::parse(ty, text).map_err(Failure::Usage)?;
    let statuses = client
        .write(vec![t::WriteValue {
            node_id: n.clone(),
            attribute_id: t::AttributeId::Value as u32,
            value: t::DataValue::value(value.clone()),
            ..Default::default()
        }])
        .await?;
    let status = statuses
        .first()
        .copied()
        .unwrap_or(StatusCode::BadUnexpectedError);
    if c.json {
        print_json(
            &json!({"node": n.to_string(), "value": values::json(&value), "status": status.to_string()}),
        );
    } else {
        outln!("{n} := {}: {status}", values::text(&value));
    }
    if status.is_bad() {
        return Err(Failure::Bad(format!("the write was refused: {status}")));
    }
    Ok(())
}

async fn call(client: &Client, c: &Common) -> Result<(), Failure> {
    let [object, method, args @ ..] = c.rest.as_slice() else {
        return Err(Failure::Usage("call needs OBJECT and METHOD".into()));
    };
    let object = node(object).map_err(Failure::Usage)?;
    let method = node(method).map_err(Failure::Usage)?;
    // The InputArguments property gives the argument types.
    let paths = client
        .translate(vec![t::BrowsePath {
            starting_node: method.clone(),
            relative_path: t::RelativePath {
                elements: Some(vec![t::RelativePathElement {
                    reference_type_id: NodeId::ns0(46),
                    include_subtypes: true,
                    target_name: t::QualifiedName::new(0, "InputArguments"),
                    ..Default::default()
                }]),
            },
        }])
        .await?;
    let mut expected: Vec<t::Argument> = Vec::new();
    if let Some(target) = paths
        .first()
        .filter(|p| p.status_code.is_good())
        .and_then(|p| p.targets.as_ref())
        .and_then(|t| t.first())
    {
        let v = client
            .read_values(std::slice::from_ref(&target.target_id.node_id))
            .await?;
        if let Some(Variant::Array(a)) = v.first().and_then(|d| d.value.as_ref()) {
            for i in 0..a.values().len() {
                if let Some(Variant::ExtensionObject(eo)) = a.values().get(i) {
                    if let Some(arg) = eo.downcast_ref::<t::Argument>() {
                        expected.push(arg.clone());
                    }
                }
            }
        }
    }
    if expected.len() != args.len() {
        return Err(Failure::Usage(format!(
            "{method} takes {} argument(s): {}",
            expected.len(),
            expected
                .iter()
                .map(|a| a.name.as_str().unwrap_or("?").to_owned())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let mut inputs = Vec::new();
    for (a, text) in expected.iter().zip(args) {
        let ty = values::builtin_of(&a.data_type).ok_or_else(|| {
            Failure::Usage(format!(
                "argument {}: type {} cannot be given as text",
                a.name, a.data_type
            ))
        })?;
        inputs.push(
            values::parse(ty, text)
                .map_err(|e| Failure::Usage(format!("argument {}: {e}", a.name)))?,
        );
    }
    let results = client
        .call(vec![t::CallMethodRequest {
            object_id: object,
            method_id: method.clone(),
            input_arguments: Some(inputs),
        }])
        .await?;
    let r = results
        .into_iter()
        .next()
        .ok_or_else(|| Failure::Bad("no result".into()))?;
    let outs = r.output_arguments.unwrap_or_default();
    if c.json {
        print_json(&json!({
            "method": method.to_string(),
            "status": r.status_code.to_string(),
            "outputs": outs.iter().map(values::json).collect::<Vec<_>>(),
        }));
    } else {
        outln!("{method}: {}", r.status_code);
        for o in &outs {
            outln!("  {}", values::text(o));
        }
    }
    if r.status_code.is_bad() {
        return Err(Failure::Bad(format!("the call failed: {}", r.status_code)));
    }
    Ok(())
}

/// `uascale shutdown`: `Server.RequestServerStateChange` with State
/// Shutdown (or Running for `--cancel`).
async fn shutdown(client: &Client, c: &Common, cancel: bool) -> Result<(), Failure> {
    if let Some(extra) = c.rest.first() {
        return Err(Failure::Usage(format!("unexpected argument {extra:?}")));
    }
    let delay: u32 = match c.flag("--delay") {
        Some(d) => d
            .parse()
            .map_err(|_| Failure::Usage(format!("--delay {d:?} is not a number of seconds")))?,
        None => 5,
    };
    let return_at = match c.flag("--return-at") {
        Some(text) => text.parse::<t::DateTime>().map_err(|e| {
            Failure::Usage(format!(
                "--return-at {text:?}: {e} (RFC 3339 UTC, e.g. 2026-01-31T12:00:00Z)"
            ))
        })?,
        None => t::DateTime::MIN,
    };
    let state = if cancel {
        t::ServerState::Running
    } else {
        t::ServerState::Shutdown
    };
    let reason = c.flag("--reason").unwrap_or("");
    let results = client
        .call(vec![t::CallMethodRequest {
            object_id: NodeId::ns0(t::ids::object::Server),
            method_id: NodeId::ns0(t::ids::method::Server_RequestServerStateChange),
            input_arguments: Some(vec![
                Variant::Int32(state.0),
                Variant::DateTime(return_at),
                Variant::UInt32(delay),
                Variant::LocalizedText(Box::new(t::LocalizedText::new("en", reason))),
                Variant::Boolean(false),
            ]),
        }])
        .await?;
    let status = results
        .first()
        .map(|r| r.status_code)
        .ok_or_else(|| Failure::Bad("no result".into()))?;
    if status == StatusCode::BadUserAccessDenied {
        return Err(Failure::Bad(format!(
            "{status}: the server lets only the users of its server.admin_users change its \
             state (--user NAME or --cert FILE --key FILE)"
        )));
    }
    if status.is_bad() {
        return Err(Failure::Bad(format!("the server refused: {status}")));
    }
    if cancel {
        outln!("planned shutdown cancelled");
    } else {
        outln!("the server shuts down in {delay} s");
    }
    Ok(())
}
