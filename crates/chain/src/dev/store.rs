//! Persistence of the development chain in its data directory.
//!
//! - `blocks.dat`: the magic `PLBLKS01`, then every block ever accepted, in
//!   arrival order, each as a 4-byte little-endian length, a 4-byte checksum
//!   (the first bytes of the payload's double SHA-256, as Core's P2P framing)
//!   and the consensus encoding. Append-only; from the first record that is
//!   torn or fails its checksum (a crash or power loss mid-write, garbage
//!   left by the file system) the tail is cut off when loading. Files of the
//!   older format without checksums are converted on open.
//! - `tip.txt`: the hash of the active tip, so a restart keeps the same
//!   active chain among branches of equal height.
//! - `invalid.txt`: hashes marked by `invalidateblock`, one per line.
//! - `mempool.dat`: the mempool, same record format as blocks (without the
//!   magic). A transaction accepted without removing any other is appended
//!   (a rewrite per broadcast made each broadcast cost the whole mempool);
//!   any other change rewrites the file. A torn or damaged tail (a crash
//!   mid-append) is cut off when loading, keeping the transactions before it.
//! - `faucet.key`: the hex secret key of the faucet that coinbases pay to.
//! - `.lock`: held with `flock` while the chain is open (and holding the
//!   owner's process id, for the error message), so that two processes never
//!   append to the same `blocks.dat`; the kernel releases it when the owner
//!   dies, however it dies.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use bitcoin::consensus::{deserialize, serialize};
use bitcoin::hashes::{sha256d, Hash as _};
use bitcoin::{Block, BlockHash, Transaction};

/// First bytes of a `blocks.dat` with checksummed records.
const BLOCKS_MAGIC: &[u8; 8] = b"PLBLKS01";

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

/// Ownership of a data directory: an exclusive `flock` on `.lock`, which
/// the kernel drops when the process ends (a crash or SIGKILL leaves no stale
/// lock, and a recycled process id cannot keep one alive).
#[derive(Debug)]
struct DirLock {
    _file: File,
}

impl DirLock {
    fn acquire(dir: &Path) -> Result<Self, StoreError> {
        let path = dir.join(".lock");
        let mut file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io_err(&path))?;
        #[cfg(unix)]
        {
            use rustix::fs::{flock, FlockOperation};
            if let Err(e) = flock(&file, FlockOperation::NonBlockingLockExclusive) {
                if e == rustix::io::Errno::WOULDBLOCK {
                    let pid = fs::read_to_string(&path)
                        .ok()
                        .and_then(|s| s.trim().parse::<u32>().ok())
                        .unwrap_or(0);
                    return Err(StoreError::Locked { path, pid });
                }
                return Err(io_err(&path)(e.into()));
            }
        }
        // Only the owner writes its id, after it holds the lock.
        file.set_len(0).map_err(io_err(&path))?;
        file.write_all(std::process::id().to_string().as_bytes())
            .map_err(io_err(&path))?;
        Ok(Self { _file: file })
    }
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
    /// The active tip when the chain was last written.
    pub tip: Option<BlockHash>,
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
        let blocks = load_blocks(&blocks_path)?;
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&blocks_path)
            .map_err(io_err(&blocks_path))?;
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
        let mempool_path = dir.join("mempool.dat");
        let mempool = load_mempool(&mempool_path);
        let tip = fs::read_to_string(dir.join("tip.txt"))
            .ok()
            .and_then(|s| s.trim().parse::<BlockHash>().ok());
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
                tip,
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
        let record = encode_record(&serialize(block));
        let path = self.dir.join("blocks.dat");
        self.blocks.write_all(&record).map_err(io_err(&path))?;
        self.blocks.flush().map_err(io_err(&path))
    }

    /// Records the active tip.
    ///
    /// # Errors
    /// IO errors.
    pub fn write_tip(&self, tip: &BlockHash) -> Result<(), StoreError> {
        write_atomic(&self.dir.join("tip.txt"), format!("{tip}\n").as_bytes())
    }

    /// Rewrites the invalid-block list.
    ///
    /// # Errors
    /// IO errors.
    pub fn write_invalid(&self, hashes: &[BlockHash]) -> Result<(), StoreError> {
        let text: String = hashes.iter().map(|h| format!("{h}\n")).collect();
        write_atomic(&self.dir.join("invalid.txt"), text.as_bytes())
    }

    /// Appends one transaction to the mempool file (accepted without
    /// removing any other, so the file's transactions stay the mempool's).
    ///
    /// # Errors
    /// IO errors.
    pub fn append_mempool(&self, tx: &Transaction) -> Result<(), StoreError> {
        let path = self.dir.join("mempool.dat");
        let mut file = OpenOptions::new()
            .append(true)
            .create(true)
            .open(&path)
            .map_err(io_err(&path))?;
        file.write_all(&encode_record(&serialize(tx)))
            .map_err(io_err(&path))
    }

    /// Rewrites the mempool file.
    ///
    /// # Errors
    /// IO errors.
    pub fn write_mempool(&self, txs: &[&Transaction]) -> Result<(), StoreError> {
        let mut out = Vec::new();
        for tx in txs {
            out.extend_from_slice(&encode_record(&serialize(*tx)));
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

fn checksum(payload: &[u8]) -> [u8; 4] {
    let h = sha256d::Hash::hash(payload);
    let mut c = [0u8; 4];
    c.copy_from_slice(&h.as_byte_array()[..4]);
    c
}

/// One record: length, checksum, payload.
fn encode_record(payload: &[u8]) -> Vec<u8> {
    let mut record = Vec::with_capacity(payload.len() + 8);
    record.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    record.extend_from_slice(&checksum(payload));
    record.extend_from_slice(payload);
    record
}

/// Reads `blocks.dat`: converts a file of the old format, cuts a damaged
/// tail off (so the next append starts on a good record) and returns the blocks.
fn load_blocks(path: &Path) -> Result<Vec<Block>, StoreError> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            write_atomic(path, BLOCKS_MAGIC)?;
            return Ok(Vec::new());
        }
        Err(e) => return Err(io_err(path)(e)),
    };
    if bytes.is_empty() || !bytes.starts_with(BLOCKS_MAGIC) {
        // The format before checksums: length-prefixed records. Convert it
        // once, through a temporary file and a rename.
        let (blocks, _) = parse_records::<Block>(path, &bytes, false)?;
        let mut out = BLOCKS_MAGIC.to_vec();
        for b in &blocks {
            out.extend_from_slice(&encode_record(&serialize(b)));
        }
        write_atomic(path, &out)?;
        if !bytes.is_empty() {
            tracing::info!(path = %path.display(), blocks = blocks.len(), "converted blocks.dat to checksummed records");
        }
        return Ok(blocks);
    }
    let (blocks, good) = parse_records::<Block>(path, &bytes[BLOCKS_MAGIC.len()..], true)?;
    let good_len = (BLOCKS_MAGIC.len() + good) as u64;
    if good_len < bytes.len() as u64 {
        tracing::warn!(
            path = %path.display(),
            cut_bytes = bytes.len() as u64 - good_len,
            kept_blocks = blocks.len(),
            "blocks.dat ends in a torn or damaged record; cutting it off"
        );
        let file = OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(io_err(path))?;
        file.set_len(good_len).map_err(io_err(path))?;
        file.sync_all().map_err(io_err(path))?;
    }
    Ok(blocks)
}

/// Reads `mempool.dat`. The mempool is a cache of transactions that can be
/// sent again; a file that is unreadable or damaged must not keep the chain
/// from starting (Core too starts with an empty mempool when it cannot load
/// `mempool.dat`). A torn or damaged record ends what is kept, and the file
/// is cut to the records before it, so that the next append follows an
/// intact record; an unreadable file is discarded with a warning.
fn load_mempool(path: &Path) -> Vec<Transaction> {
    let bytes = match fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Vec::new(),
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "discarding an unreadable mempool.dat");
            return Vec::new();
        }
    };
    // With checksums a bad record only ends the intact prefix; an error
    // (not expected) keeps nothing.
    let (txs, good) = parse_records::<Transaction>(path, &bytes, true).unwrap_or_default();
    if good < bytes.len() {
        tracing::warn!(
            path = %path.display(),
            cut_bytes = bytes.len() - good,
            kept_transactions = txs.len(),
            "mempool.dat ends in a torn or damaged record; cutting it off"
        );
        let cut = if good == 0 {
            fs::remove_file(path)
        } else {
            OpenOptions::new()
                .write(true)
                .open(path)
                .and_then(|f| f.set_len(good as u64))
        };
        if let Err(e) = cut {
            // Appends after a damaged tail would be lost on the next load:
            // start over with an empty mempool instead.
            tracing::warn!(path = %path.display(), error = %e, "discarding a damaged mempool.dat");
            let _ = fs::remove_file(path);
            return Vec::new();
        }
    }
    txs
}

/// Parses records (`checksummed`: length, checksum, payload; otherwise the
/// old length and payload) and returns them and the length of the intact
/// prefix. With checksums, the first record that is short, fails its
/// checksum or does not decode ends the intact prefix; without, only a short
/// record does and a record that does not decode is an error.
fn parse_records<T: bitcoin::consensus::Decodable>(
    path: &Path,
    bytes: &[u8],
    checksummed: bool,
) -> Result<(Vec<T>, usize), StoreError> {
    let header = if checksummed { 8 } else { 4 };
    let mut out = Vec::new();
    let mut pos = 0usize;
    while pos + header <= bytes.len() {
        let mut len_bytes = [0u8; 4];
        len_bytes.copy_from_slice(&bytes[pos..pos + 4]);
        let len = u32::from_le_bytes(len_bytes) as usize;
        // A length beyond the file is a torn tail (checked before slicing,
        // so garbage lengths never allocate).
        let Some(record) = bytes.get(pos + header..pos + header + len) else {
            break;
        };
        if checksummed && bytes[pos + 4..pos + 8] != checksum(record) {
            break;
        }
        match deserialize::<T>(record) {
            Ok(item) => out.push(item),
            Err(_) if checksummed => break,
            Err(e) => {
                return Err(StoreError::Corrupt {
                    path: path.to_owned(),
                    offset: pos as u64,
                    reason: e.to_string(),
                })
            }
        }
        pos += header + len;
    }
    Ok((out, pos))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bitcoin::blockdata::constants::genesis_block;
    use bitcoin::Network;

    fn record_len(block: &Block) -> u64 {
        serialize(block).len() as u64 + 8
    }

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
        let good = bytes.len() as u64;
        assert_eq!(good, 8 + 2 * record_len(&block));
        let torn = bytes[8..8 + record_len(&block) as usize - 10].to_vec();
        bytes.extend_from_slice(&torn);
        fs::write(&path, &bytes).unwrap();
        {
            let (mut store, loaded) = Store::open(dir.path()).unwrap();
            assert_eq!(loaded.blocks, vec![block.clone(), block.clone()]);
            assert_eq!(fs::metadata(&path).unwrap().len(), good);
            store.append_block(&block).unwrap();
        }
        let (_, loaded) = Store::open(dir.path()).unwrap();
        assert_eq!(loaded.blocks.len(), 3);
    }

    /// Power loss can leave a full-length record of garbage (the file grew
    /// but the data never reached the disk): the checksum catches it.
    #[test]
    fn garbage_tail_of_full_length_is_cut_by_the_checksum() {
        let dir = tempfile::tempdir().unwrap();
        let block = genesis_block(Network::Regtest);
        {
            let (mut store, _) = Store::open(dir.path()).unwrap();
            store.append_block(&block).unwrap();
        }
        let path = dir.path().join("blocks.dat");
        let mut bytes = fs::read(&path).unwrap();
        let good = bytes.len() as u64;
        let payload = serialize(&block);
        bytes.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        bytes.extend_from_slice(&[0u8; 4]);
        bytes.extend(std::iter::repeat_n(0u8, payload.len()));
        fs::write(&path, &bytes).unwrap();
        let (_, loaded) = Store::open(dir.path()).unwrap();
        assert_eq!(loaded.blocks, vec![block]);
        assert_eq!(fs::metadata(&path).unwrap().len(), good);
    }

    #[test]
    fn old_format_is_converted() {
        let dir = tempfile::tempdir().unwrap();
        let block = genesis_block(Network::Regtest);
        let payload = serialize(&block);
        let mut old = (payload.len() as u32).to_le_bytes().to_vec();
        old.extend_from_slice(&payload);
        fs::write(dir.path().join("blocks.dat"), &old).unwrap();
        let (_, loaded) = Store::open(dir.path()).unwrap();
        assert_eq!(loaded.blocks, vec![block.clone()]);
        let bytes = fs::read(dir.path().join("blocks.dat")).unwrap();
        assert!(bytes.starts_with(BLOCKS_MAGIC));
        let (_, again) = Store::open(dir.path()).unwrap();
        assert_eq!(again.blocks, vec![block]);
    }

    #[test]
    fn a_directory_has_one_owner_and_a_dead_owner_leaves_no_lock() {
        let dir = tempfile::tempdir().unwrap();
        let first = Store::open(dir.path()).unwrap();
        assert!(matches!(
            Store::open(dir.path()),
            Err(StoreError::Locked { pid, .. }) if pid == std::process::id()
        ));
        drop(first);
        let again = Store::open(dir.path()).unwrap();
        drop(again);
        // A lock file left by a process that no longer exists holds no flock.
        fs::write(dir.path().join(".lock"), u32::MAX.to_string()).unwrap();
        Store::open(dir.path()).unwrap();
    }

    /// Broadcasts append to `mempool.dat`: a crash mid-append leaves a torn
    /// record, which loading cuts off, keeping the transactions before it
    /// and letting later appends be read again.
    #[test]
    fn torn_mempool_tail_is_cut_and_appends_continue() {
        let dir = tempfile::tempdir().unwrap();
        let block = genesis_block(Network::Regtest);
        let tx = block.txdata[0].clone();
        let record = serialize(&tx).len() + 8;
        {
            let (store, _) = Store::open(dir.path()).unwrap();
            store.append_mempool(&tx).unwrap();
            store.append_mempool(&tx).unwrap();
        }
        let path = dir.path().join("mempool.dat");
        let mut bytes = fs::read(&path).unwrap();
        assert_eq!(bytes.len(), 2 * record);
        let torn = bytes[..record - 5].to_vec();
        bytes.extend_from_slice(&torn);
        fs::write(&path, &bytes).unwrap();
        {
            let (store, loaded) = Store::open(dir.path()).unwrap();
            assert_eq!(loaded.mempool, vec![tx.clone(), tx.clone()]);
            assert_eq!(fs::metadata(&path).unwrap().len(), 2 * record as u64);
            store.append_mempool(&tx).unwrap();
        }
        let (store, loaded) = Store::open(dir.path()).unwrap();
        assert_eq!(loaded.mempool, vec![tx.clone(), tx.clone(), tx.clone()]);
        // A rewrite replaces what was appended.
        store.write_mempool(&[&tx]).unwrap();
        drop(store);
        let (_, loaded) = Store::open(dir.path()).unwrap();
        assert_eq!(loaded.mempool, vec![tx]);
    }

    #[test]
    fn corrupt_mempool_is_discarded_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("mempool.dat"), [7u8; 41]).unwrap();
        let (_, loaded) = Store::open(dir.path()).unwrap();
        assert!(loaded.mempool.is_empty());
        assert!(!dir.path().join("mempool.dat").exists());
    }
}
