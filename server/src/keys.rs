//! The keyring file: SHA-256 hashes of API keys mapping to tenants, plus per-tenant limits.
//! Only hashes are stored; a key is shown once, when `memra-server keys add` creates it.
//!
//! ```json
//! {"keys": [{"prefix": "mk-1a2b3c4d", "sha256": "<64 hex>", "tenant": "acme", "revoked": false}],
//!  "tenants": {"acme": {"max_in_flight": 4}}}
//! ```

use std::collections::BTreeMap;
use std::io::Write;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Printed key prefix length (`mk-` + 8 hex digits).
pub const PREFIX_LEN: usize = 11;

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyEntry {
    /// The key's first characters, to name it when revoking.
    pub prefix: String,
    /// Hex SHA-256 of the whole key.
    pub sha256: String,
    pub tenant: String,
    #[serde(default)]
    pub revoked: bool,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantLimits {
    /// Requests in flight at once (absent: the server's --tenant-max-in-flight).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<usize>,
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyringFile {
    #[serde(default)]
    pub keys: Vec<KeyEntry>,
    #[serde(default)]
    pub tenants: BTreeMap<String, TenantLimits>,
}

/// SHA-256 of `key`.
pub fn hash_key(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

pub fn to_hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Parses 64 hex digits.
pub fn from_hex32(s: &str) -> Option<[u8; 32]> {
    if s.len() != 64 || !s.is_ascii() {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

/// A new random key: `mk-` and 40 hex digits (160 bits).
pub fn new_key() -> Result<String, String> {
    let mut b = [0u8; 20];
    getrandom::fill(&mut b).map_err(|e| format!("no system randomness: {e}"))?;
    Ok(format!("mk-{}", to_hex(&b)))
}

/// Refuses a keyring file other users may write (mode & 0o022).
#[cfg(unix)]
fn check_not_writable_by_others(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o022 != 0 {
        return Err(format!(
            "{}: the keyring is writable by other users (mode {mode:03o}); anyone who can write \
             it can add keys. Fix it with `chmod 600 {}`",
            path.display(),
            path.display()
        ));
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_not_writable_by_others(_path: &Path) -> Result<(), String> {
    Ok(())
}

impl KeyringFile {
    /// Reads a keyring; a missing file is an empty keyring. A keyring that other users could
    /// write (group/world-writable, as ssh's StrictModes refuses) is an error.
    pub fn load(path: &Path) -> Result<KeyringFile, String> {
        check_not_writable_by_others(path)?;
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Self::default()),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        let k: KeyringFile = serde_json::from_str(&text)
            .map_err(|e| format!("{}: not a keyring file: {e}", path.display()))?;
        for (i, e) in k.keys.iter().enumerate() {
            if from_hex32(&e.sha256).is_none() {
                return Err(format!(
                    "{}: keys[{i}].sha256 is not 64 hex digits",
                    path.display()
                ));
            }
        }
        Ok(k)
    }

    /// Writes atomically (a temporary file renamed over the old one), readable by the owner only.
    pub fn save(&self, path: &Path) -> Result<(), String> {
        let text = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        let mut suffix = [0u8; 8];
        getrandom::fill(&mut suffix).map_err(|e| format!("random temp name: {e}"))?;
        let tmp = path.with_extension(format!("tmp-{}", to_hex(&suffix)));
        let err = |e: std::io::Error| format!("{}: {e}", tmp.display());
        let written = (|| {
            // O_CREAT|O_EXCL: never an existing file, never through a symlink.
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create_new(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
            let mut f = opts.open(&tmp).map_err(err)?;
            f.write_all(text.as_bytes()).map_err(err)?;
            f.write_all(b"\n").map_err(err)?;
            f.sync_all().map_err(err)
        })();
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            return Err(e);
        }
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            format!("{}: {e}", path.display())
        })
    }

    /// Adds a key for `tenant`; returns the key (the only time it exists in clear).
    pub fn add(&mut self, tenant: &str, max_in_flight: Option<usize>) -> Result<String, String> {
        if tenant.is_empty()
            || tenant.len() > 64
            || !tenant
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
        {
            return Err(format!(
                "tenant `{tenant}` must be 1-64 characters of letters, digits, '-', '_' or '.'"
            ));
        }
        let key = new_key()?;
        self.keys.push(KeyEntry {
            prefix: key.chars().take(PREFIX_LEN).collect(),
            sha256: to_hex(&hash_key(&key)),
            tenant: tenant.to_string(),
            revoked: false,
        });
        if let Some(n) = max_in_flight {
            self.tenants
                .entry(tenant.to_string())
                .or_default()
                .max_in_flight = Some(n);
        }
        Ok(key)
    }

    /// Revokes the one active key whose prefix starts with `prefix`.
    pub fn revoke(&mut self, prefix: &str) -> Result<KeyEntry, String> {
        if prefix.len() < 4 {
            return Err("give at least 4 characters of the key prefix".into());
        }
        let hits: Vec<usize> = (0..self.keys.len())
            .filter(|&i| !self.keys[i].revoked && self.keys[i].prefix.starts_with(prefix))
            .collect();
        match hits.as_slice() {
            [i] => {
                self.keys[*i].revoked = true;
                Ok(self.keys[*i].clone())
            }
            [] => Err(format!("no active key has the prefix `{prefix}`")),
            _ => Err(format!(
                "{} active keys have the prefix `{prefix}`; give more of it",
                hits.len()
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn add_revoke_roundtrip() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.json");
        let mut k = KeyringFile::load(&path).unwrap();
        let key = k.add("acme", Some(3)).unwrap();
        assert!(key.starts_with("mk-") && key.len() == 43);
        k.save(&path).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            !text.contains(&key[3..]),
            "the key itself must not be stored"
        );
        let mut k = KeyringFile::load(&path).unwrap();
        assert_eq!(k.keys[0].sha256, to_hex(&hash_key(&key)));
        assert_eq!(k.tenants["acme"].max_in_flight, Some(3));
        assert!(k.revoke("mk-").is_err());
        let e = k.revoke(&key[..PREFIX_LEN]).unwrap();
        assert!(e.revoked);
        assert!(k.revoke(&key[..PREFIX_LEN]).is_err(), "already revoked");
        assert!(k.add("bad tenant!", None).is_err());
    }

    #[test]
    fn corrupt_keyring_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.json");
        std::fs::write(
            &path,
            "{\"keys\":[{\"prefix\":\"mk\",\"sha256\":\"zz\",\"tenant\":\"t\"}]}",
        )
        .unwrap();
        let e = KeyringFile::load(&path).unwrap_err();
        assert!(e.contains("sha256"), "{e}");
        std::fs::write(&path, "not json").unwrap();
        assert!(
            KeyringFile::load(&path)
                .unwrap_err()
                .contains("not a keyring")
        );
    }

    #[cfg(unix)]
    #[test]
    fn keyring_writable_by_others_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.json");
        let mut k = KeyringFile::default();
        k.add("acme", None).unwrap();
        k.save(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        for bad in [0o666, 0o620, 0o602] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(bad)).unwrap();
            let e = KeyringFile::load(&path).unwrap_err();
            assert!(
                e.contains("writable by other users") && e.contains("chmod 600"),
                "{e}"
            );
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        assert_eq!(KeyringFile::load(&path).unwrap().keys.len(), 1);
    }

    #[cfg(unix)]
    #[test]
    fn save_ignores_planted_temp_files_and_symlinks() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys.json");
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "untouched").unwrap();
        // The old fixed temp name, planted as a world-writable file and as a symlink.
        let planted = path.with_extension("tmp");
        std::fs::write(&planted, "x").unwrap();
        std::fs::set_permissions(&planted, std::fs::Permissions::from_mode(0o666)).unwrap();
        let mut k = KeyringFile::default();
        k.add("acme", None).unwrap();
        k.save(&path).unwrap();
        std::fs::remove_file(&planted).unwrap();
        std::os::unix::fs::symlink(&victim, &planted).unwrap();
        k.save(&path).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_file());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(KeyringFile::load(&path).unwrap().keys.len(), 1);
        let leftovers = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(
            leftovers, 3,
            "keys.json, victim, the planted link; no temp file left"
        );
    }
}
