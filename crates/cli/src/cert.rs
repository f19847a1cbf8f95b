//! `uascale cert create|show|trust|reject|list` on the PKI directory, and
//! `uascale user hash`.

use std::path::{Path, PathBuf};
use std::time::SystemTime;

use uascale_crypto::ecc::EccCurve;
use uascale_crypto::x509::{Certificate, ExtendedKeyUsage, KeyType};
use uascale_server::pki::{self, OwnIdentity};
use uascale_server::ServerConfig;

pub const USAGE: &str =
    "usage: uascale cert create [--pki DIR] [--config FILE] [--uri URI] [--name NAME]
                          [--host NAME]... [--key rsa|ec-p256|ec-p384|ed25519] [--force]
       uascale cert show  (FILE | THUMBPRINT) [--pki DIR] [--config FILE]
       uascale cert trust (FILE | THUMBPRINT) [--pki DIR] [--config FILE]
       uascale cert reject THUMBPRINT [--pki DIR] [--config FILE]
       uascale cert list [--pki DIR] [--config FILE]
       uascale user hash

  The PKI directory is --pki, else security.pki_dir of --config, else ./pki.
  create   a self-signed application instance certificate (RSA 2048, SHA-256)
           for the server's ApplicationUri and host names, into own/ (refuses to
           replace one unless --force); --key ec-p256 (ECC_nistP256 and its
           AesGcm/ChaChaPoly variants), ec-p384 (ECC_nistP384) or ed25519
           (ECC_curve25519) makes an ECC one beside it, own/certs/cert_KEY.der
           and own/private/key_KEY.pem, as the server creates for its ECC
           policies
  show     print a certificate (a file, or one in the PKI by thumbprint prefix)
  trust    copy a certificate file into trusted/certs, or move one from
           rejected/certs by thumbprint; a running server picks it up itself
  reject   move a certificate from trusted/certs to rejected/certs
  list     the certificates and CRLs of every PKI directory
  hash     print an argon2id hash of the password on the first line of stdin,
           for [[users]] password_hash";

/// What the options say.
struct Options {
    config: ServerConfig,
    pki: PathBuf,
    positional: Vec<String>,
    hosts: Vec<String>,
    force: bool,
    key: KeyType,
}

fn parse(args: &[&str]) -> Result<Options, String> {
    let mut config = ServerConfig::default();
    if let Some(pos) = args.iter().position(|a| *a == "--config") {
        let path = args.get(pos + 1).ok_or("--config needs a file")?;
        let text = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
        config = crate::config::parse(&text).map_err(|e| format!("{path}: {e}"))?;
        config.validate().map_err(|e| format!("{path}: {e}"))?;
    }
    let mut pki = None;
    let mut positional = Vec::new();
    let mut hosts = Vec::new();
    let mut force = false;
    let mut key = KeyType::Rsa;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .map(|v| (*v).to_owned())
                .ok_or_else(|| format!("{name} needs a value"))
        };
        match *arg {
            "--pki" => pki = Some(PathBuf::from(value("--pki")?)),
            "--config" => {
                value("--config")?;
            }
            "--uri" => config.server.application_uri = value("--uri")?,
            "--name" => config.server.application_name = value("--name")?,
            "--host" => hosts.push(value("--host")?),
            "--force" => force = true,
            "--key" => {
                let name = value("--key")?;
                key = KeyType::from_name(&name).ok_or_else(|| {
                    format!("--key {name:?}: one of rsa, ec-p256, ec-p384, ed25519")
                })?;
            }
            flag if flag.starts_with("--") => return Err(format!("unknown option {flag:?}")),
            other => positional.push(other.to_owned()),
        }
    }
    Ok(Options {
        pki: pki.unwrap_or_else(|| config.security.pki_dir.clone()),
        config,
        positional,
        hosts,
        force,
        key,
    })
}

/// Runs `uascale cert ARGS`; the text to print, or an error message.
pub fn run(args: &[&str]) -> Result<String, String> {
    let (command, rest) = args.split_first().ok_or(USAGE)?;
    let o = parse(rest)?;
    let one = |what: &str| -> Result<&str, String> {
        match o.positional.as_slice() {
            [one] => Ok(one.as_str()),
            _ => Err(format!("cert {command}: give one {what}")),
        }
    };
    match *command {
        "create" => create(&o),
        "show" => {
            let (path, cert) = find(&o.pki, one("file or thumbprint")?, &ALL_DIRS)?;
            Ok(format!("{}\n{}", path.display(), describe(&cert)))
        }
        "trust" => trust(&o.pki, one("file or thumbprint")?),
        "reject" => reject(&o.pki, one("thumbprint")?),
        "list" => list(&o.pki),
        _ => Err(USAGE.into()),
    }
}

fn create(o: &Options) -> Result<String, String> {
    pki::create_layout(&o.pki).map_err(|e| e.to_string())?;
    let (cert_path, key_path) = match o.key {
        KeyType::Rsa => (o.pki.join(pki::OWN_CERT), o.pki.join(pki::OWN_KEY)),
        KeyType::EcP256 => pki::own_ecc_paths(&o.pki, EccCurve::NistP256),
        KeyType::EcP384 => pki::own_ecc_paths(&o.pki, EccCurve::NistP384),
        KeyType::Ed25519 => pki::own_ecc_paths(&o.pki, EccCurve::Curve25519),
    };
    if (cert_path.exists() || key_path.exists()) && !o.force {
        return Err(format!(
            "{} already exists (--force replaces it; clients that trusted the old one must trust the new one)",
            cert_path.display()
        ));
    }
    let mut identity = OwnIdentity::for_config(&o.config);
    if !o.hosts.is_empty() {
        let mut hosts = o.hosts.clone();
        hosts.extend(identity.host_names);
        let mut seen = std::collections::HashSet::new();
        hosts.retain(|h| seen.insert(h.to_ascii_lowercase()));
        identity.host_names = hosts;
    }
    let (cert, key) =
        pki::create_own_of(&identity, o.key, SystemTime::now()).map_err(|e| e.to_string())?;
    pki::write_atomically(&key_path, key.as_bytes(), true).map_err(|e| e.to_string())?;
    pki::write_atomically(&cert_path, cert.der(), false).map_err(|e| e.to_string())?;
    Ok(format!(
        "created {} and {}\n{}",
        cert_path.display(),
        key_path.display(),
        describe(&cert)
    ))
}

const ALL_DIRS: [&str; 4] = [
    "own/certs",
    "trusted/certs",
    "issuers/certs",
    "rejected/certs",
];

/// A certificate by file path, or by (unique, at least 6 hex digits)
/// thumbprint prefix in `dirs` of the PKI.
fn find(pki_dir: &Path, what: &str, dirs: &[&str]) -> Result<(PathBuf, Certificate), String> {
    let as_path = Path::new(what);
    if as_path.is_file() {
        let cert = pki::read_certificate(as_path).map_err(|e| e.to_string())?;
        return Ok((as_path.to_owned(), cert));
    }
    let prefix = what.to_ascii_uppercase();
    if prefix.len() < 6 || !prefix.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(format!(
            "{what:?} is neither a file nor a thumbprint (at least 6 hex digits)"
        ));
    }
    let mut found = Vec::new();
    for dir in dirs {
        for (path, cert) in certificates_in(&pki_dir.join(dir)) {
            if cert.thumbprint_hex().starts_with(&prefix) {
                found.push((path, cert));
            }
        }
    }
    match found.len() {
        0 => Err(format!(
            "no certificate with thumbprint {prefix}... in {} ({})",
            pki_dir.display(),
            dirs.join(", ")
        )),
        1 => Ok(found.remove(0)),
        _ => Err(format!(
            "thumbprint {prefix}... is ambiguous: {}",
            found
                .iter()
                .map(|(p, _)| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )),
    }
}

fn certificates_in(dir: &Path) -> Vec<(PathBuf, Certificate)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<(PathBuf, Certificate)> = entries
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.is_file())
        .filter_map(|p| pki::read_certificate(&p).ok().map(|c| (p, c)))
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}

fn trust(pki_dir: &Path, what: &str) -> Result<String, String> {
    pki::create_layout(pki_dir).map_err(|e| e.to_string())?;
    let (from, cert) = find(pki_dir, what, &["rejected/certs"])?;
    let to = pki_dir
        .join("trusted/certs")
        .join(pki::file_name_for(&cert));
    pki::write_atomically(&to, cert.der(), false).map_err(|e| e.to_string())?;
    let rejected = pki_dir.join("rejected/certs");
    if from.starts_with(&rejected) {
        std::fs::remove_file(&from).map_err(|e| format!("{}: {e}", from.display()))?;
    }
    Ok(format!(
        "trusted {} ({})\n  -> {}",
        cert.subject_name(),
        cert.thumbprint_hex(),
        to.display()
    ))
}

fn reject(pki_dir: &Path, what: &str) -> Result<String, String> {
    let (from, cert) = find(pki_dir, what, &["trusted/certs"])?;
    let to = pki_dir
        .join("rejected/certs")
        .join(pki::file_name_for(&cert));
    pki::create_layout(pki_dir).map_err(|e| e.to_string())?;
    pki::write_atomically(&to, cert.der(), false).map_err(|e| e.to_string())?;
    std::fs::remove_file(&from).map_err(|e| format!("{}: {e}", from.display()))?;
    Ok(format!(
        "no longer trusted: {} ({})\n  -> {}",
        cert.subject_name(),
        cert.thumbprint_hex(),
        to.display()
    ))
}

fn list(pki_dir: &Path) -> Result<String, String> {
    if !pki_dir.is_dir() {
        return Err(format!(
            "{}: no PKI directory (uascale cert create makes one)",
            pki_dir.display()
        ));
    }
    let now = SystemTime::now();
    let mut out = String::new();
    for dir in ALL_DIRS {
        out.push_str(&format!("{dir}:\n"));
        let certs = certificates_in(&pki_dir.join(dir));
        if certs.is_empty() {
            out.push_str("  (none)\n");
        }
        for (path, cert) in certs {
            out.push_str(&format!(
                "  {}  {}{}\n      uri {}  until {}  {}\n",
                cert.thumbprint_hex(),
                cert.subject_name(),
                if cert.is_time_valid(now) {
                    ""
                } else {
                    "  [EXPIRED or not yet valid]"
                },
                cert.application_uri().unwrap_or("-"),
                date(cert.not_after()),
                path.file_name()
                    .map(|n| n.to_string_lossy())
                    .unwrap_or_default(),
            ));
        }
    }
    for dir in ["trusted/crl", "issuers/crl"] {
        out.push_str(&format!("{dir}:\n"));
        let Ok(entries) = std::fs::read_dir(pki_dir.join(dir)) else {
            continue;
        };
        let mut any = false;
        for path in entries.filter_map(Result::ok).map(|e| e.path()) {
            any = true;
            match pki::read_crl(&path) {
                Ok(crl) => out.push_str(&format!(
                    "  {}  {} revoked, updated {}\n",
                    crl.issuer_name(),
                    crl.revoked_count(),
                    date(crl.this_update())
                )),
                Err(e) => out.push_str(&format!("  unreadable: {e}\n")),
            }
        }
        if !any {
            out.push_str("  (none)\n");
        }
    }
    Ok(out)
}

/// `YYYY-MM-DD hh:mm:ss UTC`.
fn date(t: SystemTime) -> String {
    let secs = match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => d.as_secs() as i64,
        Err(e) => -(e.duration().as_secs() as i64),
    };
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

fn eku_names(eku: ExtendedKeyUsage) -> Vec<&'static str> {
    let mut names = Vec::new();
    if eku.server_auth {
        names.push("serverAuth");
    }
    if eku.client_auth {
        names.push("clientAuth");
    }
    if eku.any {
        names.push("any");
    }
    names
}

/// Every field an operator checks before trusting a certificate.
pub fn describe(cert: &Certificate) -> String {
    let list = |v: Vec<String>| {
        if v.is_empty() {
            "-".to_owned()
        } else {
            v.join(", ")
        }
    };
    format!(
        "  subject     {}\n  issuer      {}\n  thumbprint  {}\n  serial      {}\n  valid       {} .. {}\n  \
         uri         {}\n  dns         {}\n  ip          {}\n  key         {:?} {} bits\n  \
         signature   {:?}\n  key usage   {}\n  ext. usage  {}\n  CA          {}",
        cert.subject_name(),
        cert.issuer_name(),
        cert.thumbprint_hex(),
        uascale_crypto::x509::hex(cert.serial()),
        date(cert.not_before()),
        date(cert.not_after()),
        cert.application_uri().unwrap_or("-"),
        list(cert.dns_names().to_vec()),
        list(cert.ip_addresses().iter().map(|i| i.to_string()).collect()),
        cert.key_algorithm(),
        cert.key_bits(),
        cert.signature_algorithm(),
        cert.key_usage()
            .map_or("-".to_owned(), |k| k.names().join(", ")),
        cert.extended_key_usage()
            .map_or("-".to_owned(), |e| eku_names(e).join(", ")),
        if cert.is_ca() { "yes" } else { "no" },
    )
}

/// `uascale user hash`: the argon2id PHC string of the password on the
/// first line of `input`.
pub fn hash_from(input: &mut dyn std::io::BufRead) -> Result<String, String> {
    let mut line = String::new();
    input
        .read_line(&mut line)
        .map_err(|e| format!("cannot read the password: {e}"))?;
    let password = line.trim_end_matches(['\r', '\n']);
    if password.is_empty() {
        return Err("empty password".into());
    }
    uascale_server::identity::hash_password(password.as_bytes()).map_err(str::to_owned)
}

#[cfg(test)]
mod tests {
    #[test]
    fn dates() {
        let t = |s| std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(s);
        assert_eq!(super::date(t(0)), "1970-01-01 00:00:00 UTC");
        assert_eq!(super::date(t(1_700_000_000)), "2023-11-14 22:13:20 UTC");
        assert_eq!(super::date(t(951_782_400)), "2000-02-29 00:00:00 UTC");
    }
}
