//! The node's long-lived key and the control API's cookie, both kept in the data directory.

use std::fs;
use std::io::Write as _;
use std::path::{Path, PathBuf};

use secp256k1::SecretKey;

use crate::NodeError;

/// File holding the node key, hex, created once and never overwritten.
pub const NODE_KEY_FILE: &str = "node_key";
/// File holding `__cookie__:<hex>` for the control API, rewritten at each start.
pub const COOKIE_FILE: &str = ".cookie";
/// The user name in the cookie, as Bitcoin Core writes it.
pub const COOKIE_USER: &str = "__cookie__";

fn random_32() -> Result<[u8; 32], NodeError> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes).map_err(NodeError::Random)?;
    Ok(bytes)
}

/// Writes `contents` to a new file readable by the owner only; fails if it exists.
fn write_private(path: &Path, contents: &str) -> std::io::Result<()> {
    let mut options = fs::OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt as _;
        options.mode(0o600);
    }
    let mut file = options.open(path)?;
    file.write_all(contents.as_bytes())?;
    file.sync_all()
}

/// Loads the node key from `data_dir`, creating it on first start.
///
/// # Errors
/// The file cannot be read or written, or it does not hold a valid key.
pub fn load_or_create_node_key(data_dir: &Path) -> Result<SecretKey, NodeError> {
    let path = data_dir.join(NODE_KEY_FILE);
    let io = |e| NodeError::Io(path.clone(), e);
    match fs::read_to_string(&path) {
        Ok(text) => {
            let bytes =
                hex::decode(text.trim()).map_err(|_| NodeError::BadNodeKey(path.clone()))?;
            SecretKey::from_slice(&bytes).map_err(|_| NodeError::BadNodeKey(path.clone()))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let key = loop {
                if let Ok(key) = SecretKey::from_slice(&random_32()?) {
                    break key;
                }
            };
            write_private(&path, &hex::encode(key.secret_bytes())).map_err(io)?;
            Ok(key)
        }
        Err(e) => Err(io(e)),
    }
}

/// Writes a fresh cookie; returns its path and the password.
///
/// # Errors
/// The file cannot be written.
pub fn write_cookie(data_dir: &Path) -> Result<(PathBuf, String), NodeError> {
    let path = data_dir.join(COOKIE_FILE);
    let password = hex::encode(random_32()?);
    // A cookie left by a crash is stale: replace it.
    match fs::remove_file(&path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(NodeError::Io(path, e)),
    }
    write_private(&path, &format!("{COOKIE_USER}:{password}"))
        .map_err(|e| NodeError::Io(path.clone(), e))?;
    Ok((path, password))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_key_is_created_once_and_kept() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create_node_key(dir.path()).unwrap();
        let again = load_or_create_node_key(dir.path()).unwrap();
        assert_eq!(first, again);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt as _;
            let mode = fs::metadata(dir.path().join(NODE_KEY_FILE))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        fs::write(dir.path().join(NODE_KEY_FILE), "not hex").unwrap();
        assert!(matches!(
            load_or_create_node_key(dir.path()),
            Err(NodeError::BadNodeKey(_))
        ));
    }

    #[test]
    fn cookie_is_replaced_at_each_start() {
        let dir = tempfile::tempdir().unwrap();
        let (path, a) = write_cookie(dir.path()).unwrap();
        let (_, b) = write_cookie(dir.path()).unwrap();
        assert_ne!(a, b);
        assert_eq!(fs::read_to_string(path).unwrap(), format!("__cookie__:{b}"));
    }
}
