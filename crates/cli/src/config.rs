//! The TOML configuration file of `uascale serve` (`--config FILE`) and
//! `--print-config`. The file's shape is [`ServerConfig`] itself: every key
//! is optional, what is absent keeps the default documented there (and in
//! docs/configuration.md); unknown keys are errors that name the key.
//! Ranges are checked by [`ServerConfig::validate`], after the command
//! line's flags are applied.

use uascale_server::ServerConfig;

/// Parses a file's text; errors name the key and line.
pub fn parse(text: &str) -> Result<ServerConfig, String> {
    toml::from_str(text).map_err(|e| e.to_string())
}

/// Every key with its value, as TOML text that [`parse`] reads back.
pub fn to_toml(config: &ServerConfig) -> String {
    toml::to_string_pretty(config)
        .unwrap_or_else(|e| format!("# cannot print the configuration: {e}\n"))
}

/// [`to_toml`] for the log: the same, with the users' password hashes left
/// out (a hash lets whoever reads the log guess passwords offline).
pub fn for_log(config: &ServerConfig) -> String {
    let mut shown = config.clone();
    for u in &mut shown.users {
        u.password_hash = "(not logged)".into();
    }
    to_toml(&shown)
}

#[cfg(test)]
mod tests {
    use super::*;
    use uascale_crypto::policy::SecurityPolicy;
    use uascale_types::MessageSecurityMode;

    fn checked(text: &str) -> Result<ServerConfig, String> {
        let c = parse(text)?;
        c.validate().map_err(|e| e.to_string())?;
        Ok(c)
    }

    #[test]
    fn unknown_and_mistyped_keys_are_named() {
        let e = parse("[server]\nprot = 1\n").unwrap_err();
        assert!(e.contains("prot"), "{e}");
        let e = parse("[limits]\nmax_message_size = \"big\"\n").unwrap_err();
        assert!(e.contains("max_message_size"), "{e}");
        let e = parse("[nope]\n").unwrap_err();
        assert!(e.contains("nope"), "{e}");
        let e = parse("[operation_limits]\nmax_nodes_per_reed = 5\n").unwrap_err();
        assert!(e.contains("max_nodes_per_reed"), "{e}");
        let e = parse("[demo]\nrate_ms = -1\n").unwrap_err();
        assert!(e.contains("rate_ms"), "{e}");
    }

    #[test]
    fn ranges_are_checked_with_the_key() {
        let e = checked("[limits]\nreceive_buffer_size = 100\n").unwrap_err();
        assert_eq!(e, "limits.receive_buffer_size = 100: must be at least 8192");
        let e = checked("[demo]\nrate_ms = 0\n").unwrap_err();
        assert!(e.contains("demo.rate_ms"), "{e}");
        let e = checked("[subscriptions]\nmax_publish_request_count = 0\n").unwrap_err();
        assert!(e.contains("subscriptions.max_publish_request_count"), "{e}");
        let e = checked("[limits]\nreassembly_unactivated_percent = 101\n").unwrap_err();
        assert!(e.contains("limits.reassembly_unactivated_percent"), "{e}");
        let e = checked("[limits]\nmin_token_lifetime_ms = 7200000\n").unwrap_err();
        assert!(e.contains("limits.min_token_lifetime_ms"), "{e}");
        let e = checked("[operation_limits]\nmax_nodes_per_browse = 0\n").unwrap_err();
        assert!(e.contains("operation_limits.max_nodes_per_browse"), "{e}");
        let e = checked("[server]\nactivation_deadline_ms = 0\n").unwrap_err();
        assert!(e.contains("server.activation_deadline_ms"), "{e}");
        let e = checked("[subscriptions]\ntimer_resolution_ms = 1001\n").unwrap_err();
        assert_eq!(
            e,
            "subscriptions.timer_resolution_ms = 1001: must be at most 1000"
        );
        let e = checked("[subscriptions]\ntimer_resolution_ms = -5\n").unwrap_err();
        assert!(e.contains("timer_resolution_ms"), "{e}");
        // 0 turns the grid off.
        let c = checked("[subscriptions]\ntimer_resolution_ms = 0\n").unwrap();
        assert_eq!(c.subscriptions.timer_grid(), std::time::Duration::ZERO);
    }

    #[test]
    fn security_keys() {
        let c = checked(
            "[security]\npolicies = [\"Basic256Sha256\"]\nmodes = [\"SignAndEncrypt\"]\n\
             allow_security_none = false\ntrust_all_client_certificates = true\n\
             pki_dir = \"/tmp/x\"\nmax_failed_authentication_attempts = 0\n\
             [[users]]\nname = \"alice\"\n\
             password_hash = \"$argon2id$v=19$m=64,t=1,p=1$MDEyMzQ1Njc4OWFiY2RlZg$VqTeVXbWRg6XKh3mS9Zb5B5y4gFHmT1nbC3WlbnJEhc\"\n",
        )
        .unwrap();
        assert_eq!(
            c.security.endpoints(),
            [(
                SecurityPolicy::Basic256Sha256,
                MessageSecurityMode::SignAndEncrypt
            )]
        );
        assert!(c.security.trust_all_client_certificates);
        assert!(c.security.pki_options().trust_all_client_certificates);
        assert_eq!(c.users.len(), 1);
        assert_eq!(c.security.max_failed_authentication_attempts, 0);
        let text = to_toml(&c);
        assert!(text.contains("[[users]]"), "{text}");
        let again = checked(&text).unwrap();
        assert_eq!(again, c);
        assert_eq!(to_toml(&again), text);
        // The full URI is read too.
        let c = checked(
            "[security]\npolicies = [\"http://opcfoundation.org/UA/SecurityPolicy#Aes256_Sha256_RsaPss\"]\n",
        )
        .unwrap();
        assert_eq!(c.security.policies, [SecurityPolicy::Aes256Sha256RsaPss]);

        for (bad, key) in [
            (
                "[security]\npolicies = [\"Basic128Rsa15\"]\n",
                "security.policies",
            ),
            ("[security]\npolicies = [\"None\"]\n", "security.policies"),
            ("[security]\nmodes = [\"None\"]\n", "security.modes"),
            (
                "[security]\npolicies = []\nallow_security_none = false\n",
                "no endpoint",
            ),
            (
                "[[users]]\nname = \"bob\"\npassword_hash = \"hunter2\"\n",
                "users[0].password_hash",
            ),
            (
                "[[users]]\nname = \"alice\"\n\
                 password_hash = \"$argon2id$v=19$m=64,t=1,p=1$MDEyMzQ1Njc4OWFiY2RlZg$VqTeVXbWRg6XKh3mS9Zb5B5y4gFHmT1nbC3WlbnJEhc\"\n\
                 [[users]]\nname = \"alice\"\n\
                 password_hash = \"$argon2id$v=19$m=64,t=1,p=1$MDEyMzQ1Njc4OWFiY2RlZg$VqTeVXbWRg6XKh3mS9Zb5B5y4gFHmT1nbC3WlbnJEhc\"\n",
                "users[1].name = \"alice\": appears twice",
            ),
        ] {
            let e = checked(bad).unwrap_err();
            assert!(e.contains(key), "{bad}: {e}");
        }
        let e = parse("[[users]]\nname = \"bob\"\npasword = \"x\"\n").unwrap_err();
        assert!(e.contains("pasword"), "{e}");
    }

    #[test]
    fn printed_config_round_trips() {
        let c = checked(
            "[server]\nport = 4999\nnodesets = [\"a.xml\", \"b.xml\"]\n[demo]\nnodes = 7\n\
             [subscriptions]\nmax_subscription_count = 0\nmax_queue_size = 64\n\
             [operation_limits]\nmax_nodes_per_read = 5\n",
        )
        .unwrap();
        let text = to_toml(&c);
        let again = checked(&text).unwrap();
        assert_eq!(again.server.port, 4999);
        assert_eq!(again.demo.nodes, 7);
        assert_eq!(again.subscriptions.max_subscription_count, 0);
        assert_eq!(again.subscriptions.max_queue_size, 64);
        assert_eq!(again.operation_limits.max_nodes_per_read, 5);
        assert_eq!(
            again.server.nodesets,
            vec![std::path::PathBuf::from("a.xml"), "b.xml".into()]
        );
        assert_eq!(again, c);
        assert_eq!(to_toml(&again), text);
        // The defaults too, and they are valid.
        let defaults = ServerConfig::default();
        defaults.validate().unwrap();
        assert_eq!(checked(&to_toml(&defaults)).unwrap(), defaults);
        assert_eq!(parse("").unwrap(), defaults);
        // Resolved, every derived default is printed and read back as set.
        let resolved = defaults.resolved(4);
        let text = to_toml(&resolved);
        assert!(
            text.contains("[admission]") && text.contains("[runtime]"),
            "{text}"
        );
        assert!(text.contains("max_concurrent_handshakes = 8"), "{text}");
        assert_eq!(checked(&text).unwrap(), resolved);
        assert_eq!(checked(&text).unwrap().resolved(64), resolved);
    }

    #[test]
    fn admission_keys_are_read_and_checked() {
        let c = checked(
            "[admission]\nenabled = false\nconnections_per_second = 100\n\
             connection_burst_per_address = 10\nmax_channel_count = 50\n\
             [runtime]\nworker_threads = 3\ncrypto_threads = 0\n",
        )
        .unwrap();
        assert!(!c.admission.enabled);
        assert_eq!(c.admission.connections_per_second, 100);
        assert_eq!(c.admission.connection_burst_per_address, Some(10));
        assert_eq!(c.admission.connections_per_second_per_address, None);
        assert_eq!(c.admission.max_channel_count, Some(50));
        assert_eq!(c.runtime.worker_threads, Some(3));
        assert_eq!(c.runtime.crypto_threads, 0);
        let e = checked("[runtime]\ncrypto_threads = 5000\n").unwrap_err();
        assert!(
            e.starts_with("runtime.crypto_threads = 5000: must be at most 1024"),
            "{e}"
        );
        let e = checked("[runtime]\ncrypto_threads = -1\n").unwrap_err();
        assert!(e.contains("crypto_threads"), "{e}");
        let e = checked("[admission]\nconnections_per_second_per_address = 6000\n").unwrap_err();
        assert!(
            e.starts_with("admission.connections_per_second_per_address = 6000: must not exceed"),
            "{e}"
        );
        let e = parse("[admission]\nconnections_per_sec = 5\n").unwrap_err();
        assert!(e.contains("connections_per_sec"), "{e}");
    }

    #[test]
    fn the_log_leaves_out_password_hashes() {
        let c = ServerConfig {
            users: vec![uascale_server::config::UserConfig::new(
                "alice",
                "$argon2id$v=19$m=64,t=1,p=1$MDEyMzQ1Njc4OWFiY2RlZg$VqTeVXbWRg6XKh3mS9Zb5B5y4gFHmT1nbC3WlbnJEhc",
            )],
            ..Default::default()
        };
        let text = for_log(&c);
        assert!(text.contains("name = \"alice\""), "{text}");
        assert!(!text.contains("argon2"), "{text}");
        assert!(text.contains("[operation_limits]"), "{text}");
    }
}
