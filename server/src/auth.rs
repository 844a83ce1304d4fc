//! Authentication: `Authorization: Bearer KEY` checked against the keyring's SHA-256 hashes in
//! constant time; the keyring is reloaded when its file changes. Without a keyring the server
//! is open and every request belongs to tenant `default`.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use crate::errors::ApiError;
use crate::keys::{KeyringFile, from_hex32, hash_key};

/// The tenant of open servers.
pub const DEFAULT_TENANT: &str = "default";

/// Who made a request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tenant {
    pub name: String,
    /// Its own in-flight limit, if the keyring sets one.
    pub max_in_flight: Option<usize>,
}

struct Entry {
    hash: [u8; 32],
    tenant: String,
    revoked: bool,
}

/// A parsed keyring.
pub struct Keyring {
    entries: Vec<Entry>,
    file: KeyringFile,
}

/// Compares two hashes without an early exit.
fn ct_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

impl Keyring {
    pub fn new(file: KeyringFile) -> Keyring {
        let entries = file
            .keys
            .iter()
            .filter_map(|k| {
                Some(Entry {
                    hash: from_hex32(&k.sha256)?,
                    tenant: k.tenant.clone(),
                    revoked: k.revoked,
                })
            })
            .collect();
        Keyring { entries, file }
    }

    /// Keys that are not revoked.
    pub fn active(&self) -> usize {
        self.entries.iter().filter(|e| !e.revoked).count()
    }

    /// The tenant of `key`: 401 for an unknown key, 403 for a revoked one. Every entry is
    /// compared, matched or not.
    pub fn check(&self, key: &str) -> Result<Tenant, ApiError> {
        let h = hash_key(key);
        let mut found: Option<&Entry> = None;
        for e in &self.entries {
            if ct_eq(&e.hash, &h) && found.is_none() {
                found = Some(e);
            }
        }
        match found {
            None => Err(ApiError::invalid_key()),
            Some(e) if e.revoked => Err(ApiError::revoked_key()),
            Some(e) => Ok(Tenant {
                name: e.tenant.clone(),
                max_in_flight: self
                    .file
                    .tenants
                    .get(&e.tenant)
                    .and_then(|t| t.max_in_flight),
            }),
        }
    }
}

/// A keyring file watched for changes.
pub struct KeyringWatch {
    path: PathBuf,
    current: RwLock<Arc<Keyring>>,
    stamp: RwLock<Option<(SystemTime, u64)>>,
}

fn file_stamp(path: &PathBuf) -> Option<(SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

impl KeyringWatch {
    /// Loads the keyring (an error if it exists but cannot be read or parsed).
    pub fn open(path: PathBuf) -> Result<KeyringWatch, String> {
        let stamp = file_stamp(&path);
        let file = KeyringFile::load(&path)?;
        Ok(KeyringWatch {
            path,
            current: RwLock::new(Arc::new(Keyring::new(file))),
            stamp: RwLock::new(stamp),
        })
    }

    pub fn keyring(&self) -> Arc<Keyring> {
        match self.current.read() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        }
    }

    /// Reloads if the file's mtime or size changed; keeps the old keyring when the new file
    /// does not parse. Returns whether it reloaded.
    pub fn reload_if_changed(&self) -> bool {
        let stamp = file_stamp(&self.path);
        let old = self.stamp.read().map(|s| *s).unwrap_or(None);
        if stamp == old {
            return false;
        }
        match KeyringFile::load(&self.path) {
            Ok(file) => {
                if let Ok(mut c) = self.current.write() {
                    *c = Arc::new(Keyring::new(file));
                }
                if let Ok(mut s) = self.stamp.write() {
                    *s = stamp;
                }
                tracing::info!("reloaded keyring {}", self.path.display());
                true
            }
            Err(e) => {
                tracing::warn!("keyring not reloaded (keeping the previous one): {e}");
                false
            }
        }
    }

    /// Polls the file every `every` until the process ends.
    pub fn spawn_watcher(self: &Arc<Self>, every: Duration) {
        let w = self.clone();
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(every);
            loop {
                tick.tick().await;
                let w2 = w.clone();
                let _ = tokio::task::spawn_blocking(move || w2.reload_if_changed()).await;
            }
        });
    }
}

/// The server's auth mode.
pub enum Auth {
    Open,
    Keyring(Arc<KeyringWatch>),
}

impl Auth {
    /// The tenant for a request's `Authorization` header value.
    pub fn authenticate(&self, header: Option<&[u8]>) -> Result<Tenant, ApiError> {
        let ring = match self {
            Auth::Open => {
                return Ok(Tenant {
                    name: DEFAULT_TENANT.into(),
                    max_in_flight: None,
                });
            }
            Auth::Keyring(w) => w.keyring(),
        };
        let Some(h) = header else {
            return Err(ApiError::missing_key());
        };
        let h = std::str::from_utf8(h).map_err(|_| ApiError::invalid_key())?;
        let key = h
            .strip_prefix("Bearer ")
            .or_else(|| h.strip_prefix("bearer "))
            .ok_or_else(ApiError::missing_key)?
            .trim();
        ring.check(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_to_tenants() {
        let mut f = KeyringFile::default();
        let a = f.add("acme", Some(2)).unwrap();
        let b = f.add("bolt", None).unwrap();
        f.revoke(&b[..11]).unwrap();
        let auth = Auth::Keyring(Arc::new(KeyringWatch {
            path: PathBuf::from("/nonexistent"),
            current: RwLock::new(Arc::new(Keyring::new(f))),
            stamp: RwLock::new(None),
        }));
        let t = auth
            .authenticate(Some(format!("Bearer {a}").as_bytes()))
            .unwrap();
        assert_eq!(t.name, "acme");
        assert_eq!(t.max_in_flight, Some(2));
        let e = auth.authenticate(Some(format!("Bearer {b}").as_bytes()));
        assert_eq!(e.unwrap_err().status.as_u16(), 403);
        let e = auth.authenticate(Some(b"Bearer mk-0000"));
        assert_eq!(e.unwrap_err().status.as_u16(), 401);
        assert_eq!(auth.authenticate(None).unwrap_err().status.as_u16(), 401);
        assert_eq!(Auth::Open.authenticate(None).unwrap().name, DEFAULT_TENANT);
    }
}
