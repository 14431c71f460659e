//! Persistence of the development chain in its data directory.
//!
//! - `blocks.dat`: every block ever accepted, in arrival order, each as a
//!   4-byte little-endian length and the consensus encoding. Append-only; a
//!   torn record at the end (a crash mid-write) is cut off when loading.
//! - `invalid.txt`: hashes marked by `invalidateblock`, one per line.
//! - `mempool.dat`: the mempool, same record format as blocks, rewritten on change.
//! - `faucet.key`: the hex secret key of the faucet that coinbases pay to.
//! - `.lock`: the process id of the owner while the chain is open, so that two
//!   processes never append to the same `blocks.dat`.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

use bitcoin::consensus::{deserialize, serialize};
use bitcoin::{Block, BlockHash, Transaction};

/// Why the data directory could not be read or written.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// File system error.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: io::Error,
    },
    /// Another live process has the directory open.
    #[error("{path} is in use by process {pid}")]
    Locked {
        /// The lock file.
        path: PathBuf,
        /// The owner's process id.
        pid: u32,
    },
    /// A record that does not decode.
    #[error("{path}: corrupt record at byte {offset}: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Where the record starts.
        offset: u64,
        /// What failed.
        reason: String,
    },
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> StoreError + '_ {
    move |source| StoreError::Io {
        path: path.to_owned(),
        source,
    }
}

/// The files of one development chain.
#[derive(Debug)]
pub struct Store {
    dir: PathBuf,
    blocks: File,
    _lock: DirLock,
}

/// Ownership of a data directory: a `.lock` file holding our process id,
/// removed on drop. A lock whose process is gone (crash, SIGKILL) is taken over.
#[derive(Debug)]
struct DirLock {
    path: PathBuf,
}

impl DirLock {
    fn acquire(dir: &Path) -> Result<Self, StoreError> {
        let path = dir.join(".lock");
        for _ in 0..2 {
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(mut f) => {
                    f.write_all(std::process::id().to_string().as_bytes())
                        .map_err(io_err(&path))?;
                    return Ok(Self { path });
                }
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                    let owner = fs::read_to_string(&path)
                        .ok()
                        .and_then(|s| s.trim().parse::<u32>().ok());
                    if let Some(pid) = owner.filter(|pid| process_alive(*pid)) {
                        return Err(StoreError::Locked { path, pid });
                    }
                    // Stale: its owner is gone.
                    fs::remove_file(&path).map_err(io_err(&path))?;
                }
                Err(e) => return Err(io_err(&path)(e)),
            }
        }
        Err(StoreError::Locked { path, pid: 0 })
    }
}

impl Drop for DirLock {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
    }
}

/// Whether a process with `pid` exists (Linux `/proc`; elsewhere a lock is
/// always considered stale, which loses only the protection, not data).
fn process_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Everything read back from disk.
#[derive(Debug, Default)]
pub struct Loaded {
    /// Blocks in arrival order.
    pub blocks: Vec<Block>,
    /// Invalidated block hashes.
    pub invalid: Vec<BlockHash>,
    /// Mempool transactions in arrival order.
    pub mempool: Vec<Transaction>,
}

impl Store {
    /// Opens (creating if needed) the data directory and reads its contents.
    ///
    /// # Errors
    /// IO errors and corrupt records (other than a torn last record).
    pub fn open(dir: &Path) -> Result<(Self, Loaded), StoreError> {
        fs::create_dir_all(dir).map_err(io_err(dir))?;
        let lock = DirLock::acquire(dir)?;
        let blocks_path = dir.join("blocks.dat");
        let (blocks, good_len) = read_records::<Block>(&blocks_path)?;
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&blocks_path)
            .map_err(io_err(&blocks_path))?;
        // Drop a torn tail so the next append starts on a record boundary.
        file.set_len(good_len).map_err(io_err(&blocks_path))?;
        let invalid_path = dir.join("invalid.txt");
        let invalid = match fs::read_to_string(&invalid_path) {
            Ok(s) => s
                .lines()
                .filter(|l| !l.trim().is_empty())
                .map(|l| {
                    l.trim()
                        .parse::<BlockHash>()
                        .map_err(|e| StoreError::Corrupt {
                            path: invalid_path.clone(),
                            offset: 0,
                            reason: e.to_string(),
                        })
                })
                .collect::<Result<Vec<_>, _>>()?,
            Err(e) if e.kind() == io::ErrorKind::NotFound => Vec::new(),
            Err(e) => return Err(io_err(&invalid_path)(e)),
        };
        let (mempool, _) = read_records::<Transaction>(&dir.join("mempool.dat"))?;
        Ok((
            Self {
                dir: dir.to_owned(),
                blocks: file,
                _lock: lock,
            },
            Loaded {
                blocks,
                invalid,
                mempool,
            },
        ))
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Bytes of block data on disk (Core's `size_on_disk`).
    pub fn size_on_disk(&self) -> u64 {
        self.blocks.metadata().map_or(0, |m| m.len())
    }

    /// Appends a block.
    ///
    /// # Errors
    /// IO errors.
    pub fn append_block(&mut self, block: &Block) -> Result<(), StoreError> {
        let bytes = serialize(block);
        let mut record = Vec::with_capacity(bytes.len() + 4);
        record.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        record.extend_from_slice(&bytes);
        let path = self.dir.join("blocks.dat");
        self.blocks.write_all(&record).map_err(io_err(&path))?;
        self.blocks.flush().map_err(io_err(&path))
    }

    /// Rewrites the invalid-block list.
    ///
    /// # Errors
    /// IO errors.
    pub fn write_invalid(&self, hashes: &[BlockHash]) -> Result<(), StoreError> {
        let text: String = hashes.iter().map(|h| format!("{h}\n")).collect();
        write_atomic(&self.dir.join("invalid.txt"), text.as_bytes())
    }

    /// Rewrites the mempool file.
    ///
    /// # Errors
    /// IO errors.
    pub fn write_mempool(&self, txs: &[&Transaction]) -> Result<(), StoreError> {
        let mut out = Vec::new();
        for tx in txs {
            let bytes = serialize(*tx);
            out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            out.extend_from_slice(&bytes);
        }
        write_atomic(&self.dir.join("mempool.dat"), &out)
    }
}

/// Writes through a temporary file and a rename, so a crash leaves the old or the new file.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    write_atomic_mode(path, bytes, 0o644)
}

/// As [`write_atomic`], readable by the owner only (secrets: cookie, keys).
pub(crate) fn write_secret(path: &Path, bytes: &[u8]) -> Result<(), StoreError> {
    write_atomic_mode(path, bytes, 0o600)
}

fn write_atomic_mode(path: &Path, bytes: &[u8], mode: u32) -> Result<(), StoreError> {
    let tmp = path.with_extension("tmp");
    let _ = fs::remove_file(&tmp);
    let mut options = OpenOptions::new();
    options.write(true).create_new(true);
    #[cfg(unix)]
    std::os::unix::fs::OpenOptionsExt::mode(&mut options, mode);
    #[cfg(not(unix))]
    let _ = mode;
    let mut file = options.open(&tmp).map_err(io_err(&tmp))?;
    file.write_all(bytes).map_err(io_err(&tmp))?;
    drop(file);
    fs::rename(&tmp, path).map_err(io_err(path))
}

/// Reads length-prefixed records; returns them and the length of the intact prefix.
fn read_records<T: bitcoin::consensus::Decodable>(
    path: &Path,
) -> Result<(Vec<T>, u64), StoreError> {
    let mut bytes = Vec::new();
    match File::open(path) {
        Ok(mut f) => {
            f.read_to_end(&mut bytes).map_err(io_err(path))?;
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok((Vec::new(), 0)),
        Err(e) => return Err(io_err(path)(e)),
    }
    let mut out = Vec::new();
    let mut pos = 0usize;
    while pos + 4 <= bytes.len() {
        let mut len_bytes = [0u8; 4];
        len_bytes.copy_from_slice(&bytes[pos..pos + 4]);
        let len = u32::from_le_bytes(len_bytes) as usize;
        let Some(record) = bytes.get(pos + 4..pos + 4 + len) else {
            break; // torn tail
        };
        let item = deserialize::<T>(record).map_err(|e| StoreError::Corrupt {
            path: path.to_owned(),
            offset: pos as u64,
            reason: e.to_string(),
        })?;
        out.push(item);
        pos += 4 + len;
    }
    Ok((out, pos as u64))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitcoin::blockdata::constants::genesis_block;
    use bitcoin::Network;

    #[test]
    fn torn_tail_is_cut_and_appends_continue() {
        let dir = tempfile::tempdir().unwrap();
        let block = genesis_block(Network::Regtest);
        {
            let (mut store, loaded) = Store::open(dir.path()).unwrap();
            assert!(loaded.blocks.is_empty());
            store.append_block(&block).unwrap();
            store.append_block(&block).unwrap();
        }
        // Simulate a crash in the middle of a third record.
        let path = dir.path().join("blocks.dat");
        let mut bytes = fs::read(&path).unwrap();
        let one = bytes.len() / 2;
        let torn = bytes[..one - 10].to_vec();
        bytes.extend_from_slice(&torn);
        fs::write(&path, &bytes).unwrap();
        {
            let (mut store, loaded) = Store::open(dir.path()).unwrap();
            assert_eq!(loaded.blocks, vec![block.clone(), block.clone()]);
            assert_eq!(fs::metadata(&path).unwrap().len(), 2 * one as u64);
            store.append_block(&block).unwrap();
        }
        let (_, loaded) = Store::open(dir.path()).unwrap();
        assert_eq!(loaded.blocks.len(), 3);
    }

    #[test]
    fn a_directory_has_one_owner_and_stale_locks_are_taken_over() {
        let dir = tempfile::tempdir().unwrap();
        let first = Store::open(dir.path()).unwrap();
        assert!(matches!(
            Store::open(dir.path()),
            Err(StoreError::Locked { pid, .. }) if pid == std::process::id()
        ));
        drop(first);
        let again = Store::open(dir.path()).unwrap();
        drop(again);
        // A lock left by a process that no longer exists.
        fs::write(dir.path().join(".lock"), u32::MAX.to_string()).unwrap();
        Store::open(dir.path()).unwrap();
    }

    #[test]
    fn corrupt_record_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut bytes = 5u32.to_le_bytes().to_vec();
        bytes.extend_from_slice(&[1, 2, 3, 4, 5]);
        fs::write(dir.path().join("blocks.dat"), bytes).unwrap();
        assert!(matches!(
            Store::open(dir.path()),
            Err(StoreError::Corrupt { offset: 0, .. })
        ));
    }
}
