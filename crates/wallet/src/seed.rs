//! The wallet's seed on disk: a BIP39 mnemonic in a file that only the owner
//! may read, created with fresh entropy on first use.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use bitcoin::Network;
use zeroize::Zeroizing;

use crate::hd::{mnemonic_from_entropy, Wallet, WalletError};

/// Why the seed file could not be read or created.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SeedFileError {
    /// File system error.
    #[error("{path}: {source}")]
    Io {
        /// The seed file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// The operating system's random source failed.
    #[error("no entropy: {0}")]
    Entropy(String),
    /// The seed file can be read by others than its owner.
    #[error("{path} has mode {mode:o}: a seed must be readable by its owner only (chmod 600)")]
    Permissions {
        /// The seed file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The file does not hold a valid mnemonic.
    #[error("{path}: {source}")]
    Invalid {
        /// The seed file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: WalletError,
    },
}

/// Reads the mnemonic in `path`, or creates the file with a new 24-word
/// mnemonic (256 bits from the OS) if it does not exist, then opens the
/// wallet with an empty passphrase.
///
/// The file is created with mode 0600 on Unix and never overwritten; its
/// directory is synced so that the new entry survives a power loss (else the
/// service could hand out addresses of a seed that is gone after a crash).
/// The phrase is written to a private temporary file, synced, and only then
/// linked to `path`, which fails if `path` exists: processes started together
/// on an empty directory all end up with the one seed that won, and nobody
/// ever reads a half-written file. An existing file readable by group or
/// others is refused, as ssh does with keys. The phrase is wiped from memory
/// once the wallet is derived.
///
/// # Errors
/// See [`SeedFileError`].
pub fn load_or_create(path: &Path, network: Network) -> Result<Wallet, SeedFileError> {
    let phrase = match read_existing(path)? {
        Some(phrase) => phrase,
        None => match create(path)? {
            Some(phrase) => phrase,
            // Another process linked its seed first: that one is the wallet.
            None => read_existing(path)?.ok_or_else(|| SeedFileError::Io {
                path: path.to_owned(),
                source: io::Error::new(
                    io::ErrorKind::NotFound,
                    "the seed file vanished while it was being created",
                ),
            })?,
        },
    };
    Wallet::from_mnemonic(&phrase, "", network).map_err(|source| SeedFileError::Invalid {
        path: path.to_owned(),
        source,
    })
}

/// The phrase in `path`, `None` if there is no such file.
fn read_existing(path: &Path) -> Result<Option<Zeroizing<String>>, SeedFileError> {
    let io_err = |source| SeedFileError::Io {
        path: path.to_owned(),
        source,
    };
    match fs::read_to_string(path).map(Zeroizing::new) {
        Ok(s) => {
            #[cfg(unix)]
            {
                use std::os::unix::fs::PermissionsExt;
                let mode = fs::metadata(path).map_err(io_err)?.permissions().mode() & 0o777;
                if mode & 0o077 != 0 {
                    return Err(SeedFileError::Permissions {
                        path: path.to_owned(),
                        mode,
                    });
                }
            }
            Ok(Some(Zeroizing::new(s.trim().to_owned())))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(e)),
    }
}

/// Writes a fresh phrase to `path` unless the file appeared meanwhile;
/// returns the phrase, or `None` when another process created the file.
fn create(path: &Path) -> Result<Option<Zeroizing<String>>, SeedFileError> {
    let io_err = |source| SeedFileError::Io {
        path: path.to_owned(),
        source,
    };
    let mut entropy = Zeroizing::new([0u8; 32]);
    getrandom::fill(entropy.as_mut()).map_err(|e| SeedFileError::Entropy(e.to_string()))?;
    let phrase = Zeroizing::new(mnemonic_from_entropy(entropy.as_ref()).map_err(|source| {
        SeedFileError::Invalid {
            path: path.to_owned(),
            source,
        }
    })?);
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        fs::create_dir_all(dir).map_err(io_err)?;
    }
    let mut nonce = [0u8; 8];
    getrandom::fill(&mut nonce).map_err(|e| SeedFileError::Entropy(e.to_string()))?;
    let name = path
        .file_name()
        .map_or_else(|| "seed".into(), |n| n.to_string_lossy().into_owned());
    let temp = path.with_file_name(format!(".{name}.{}.tmp", u64::from_le_bytes(nonce)));
    let written = (|| {
        let mut options = fs::OpenOptions::new();
        options.write(true).create_new(true);
        #[cfg(unix)]
        std::os::unix::fs::OpenOptionsExt::mode(&mut options, 0o600);
        let mut file = options.open(&temp)?;
        file.write_all(Zeroizing::new(format!("{}\n", phrase.as_str())).as_bytes())?;
        file.sync_all()?;
        fs::hard_link(&temp, path)
    })();
    // The temporary name goes whatever happened; the link, if made, stays.
    let _ = fs::remove_file(&temp);
    match written {
        Ok(()) => {
            sync_parent(path).map_err(io_err)?;
            Ok(Some(phrase))
        }
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(None),
        Err(e) => Err(io_err(e)),
    }
}

/// fsyncs the directory holding `path`, making a new entry durable.
fn sync_parent(path: &Path) -> io::Result<()> {
    #[cfg(unix)]
    {
        let dir = match path.parent().filter(|d| !d.as_os_str().is_empty()) {
            Some(d) => d,
            None => Path::new("."),
        };
        fs::File::open(dir)?.sync_all()?;
    }
    #[cfg(not(unix))]
    let _ = path;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn creates_once_then_reloads_the_same_wallet() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub").join("wallet.seed");
        let a = load_or_create(&path, Network::Regtest).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert_eq!(text.split_whitespace().count(), 24);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            assert_eq!(
                fs::metadata(&path).unwrap().permissions().mode() & 0o777,
                0o600
            );
        }
        let b = load_or_create(&path, Network::Regtest).unwrap();
        assert_eq!(
            a.derive_address(0, 3).unwrap(),
            b.derive_address(0, 3).unwrap()
        );
        assert_eq!(fs::read_to_string(&path).unwrap(), text);
        // Another file, another wallet.
        let c = load_or_create(&dir.path().join("other"), Network::Regtest).unwrap();
        assert_ne!(
            a.derive_address(0, 0).unwrap(),
            c.derive_address(0, 0).unwrap()
        );
    }

    /// Several processes started together on an empty data directory (two
    /// `serve` units under systemd, say) must all open the one wallet: none
    /// may fail on a file another is still writing, and none may keep a
    /// seed of its own.
    #[test]
    fn starts_racing_on_an_empty_directory_agree_on_one_seed() {
        for _ in 0..8 {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("wallet.seed");
            let barrier = std::sync::Arc::new(std::sync::Barrier::new(8));
            let starts: Vec<_> = (0..8)
                .map(|_| {
                    let (path, barrier) = (path.clone(), barrier.clone());
                    std::thread::spawn(move || {
                        barrier.wait();
                        load_or_create(&path, Network::Regtest)
                            .map(|w| w.derive_address(0, 0).unwrap())
                    })
                })
                .collect();
            let addresses: Vec<_> = starts
                .into_iter()
                .map(|s| s.join().unwrap().expect("every start opens the wallet"))
                .collect();
            assert!(
                addresses.iter().all(|a| *a == addresses[0]),
                "{addresses:?}"
            );
            let on_disk = load_or_create(&path, Network::Regtest).unwrap();
            assert_eq!(on_disk.derive_address(0, 0).unwrap(), addresses[0]);
            let names: Vec<_> = fs::read_dir(dir.path())
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            assert_eq!(names, vec![std::ffi::OsString::from("wallet.seed")]);
        }
    }

    #[cfg(unix)]
    #[test]
    fn a_seed_readable_by_others_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wallet.seed");
        load_or_create(&path, Network::Regtest).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            load_or_create(&path, Network::Regtest),
            Err(SeedFileError::Permissions { mode: 0o644, .. })
        ));
    }

    #[test]
    fn garbage_is_invalid_not_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("wallet.seed");
        fs::write(&path, "not a mnemonic").unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
        }
        assert!(matches!(
            load_or_create(&path, Network::Regtest),
            Err(SeedFileError::Invalid { .. })
        ));
        assert_eq!(fs::read_to_string(&path).unwrap(), "not a mnemonic");
    }
}
