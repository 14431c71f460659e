//! The control URL file: `<data-dir>/control_url` tells `potluck cli --data-dir` where the
//! node's control API listens, as the cookie beside it tells how to authenticate.
//!
//! Written at start (after the cookie) and removed at stop; a node killed with `kill -9`
//! leaves it behind and the next start overwrites it.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::{Path, PathBuf};

/// The file's name inside a data directory.
pub const FILE_NAME: &str = "control_url";

/// The URL a local client uses to reach a server bound to `addr`: an unspecified
/// address (0.0.0.0, ::) is reached on loopback.
pub fn url_for(addr: SocketAddr) -> String {
    let ip = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("http://{}/", SocketAddr::new(ip, addr.port()))
}

/// Writes the URL of `addr` to `<dir>/control_url`, whole or not at all (a client never
/// reads half a URL): written beside it, then renamed over it.
///
/// # Errors
/// The directory is not writable.
pub fn write(dir: &Path, addr: SocketAddr) -> io::Result<PathBuf> {
    let path = dir.join(FILE_NAME);
    let partial = dir.join(format!("{FILE_NAME}.partial"));
    std::fs::write(&partial, format!("{}\n", url_for(addr)))?;
    std::fs::rename(&partial, &path)?;
    Ok(path)
}

/// The URL in `<dir>/control_url`, or `None` when there is no such file.
///
/// # Errors
/// The file exists but cannot be read.
pub fn read(dir: &Path) -> io::Result<Option<String>> {
    match std::fs::read_to_string(dir.join(FILE_NAME)) {
        Ok(text) => Ok(Some(text.trim().to_owned())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn written_url_is_read_back_and_unspecified_means_loopback() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(read(dir.path()).unwrap(), None);
        write(dir.path(), "0.0.0.0:9736".parse().unwrap()).unwrap();
        assert_eq!(
            read(dir.path()).unwrap().as_deref(),
            Some("http://127.0.0.1:9736/")
        );
        write(dir.path(), "[::]:9746".parse().unwrap()).unwrap();
        assert_eq!(
            read(dir.path()).unwrap().as_deref(),
            Some("http://[::1]:9746/")
        );
        assert!(!dir.path().join("control_url.partial").exists());
    }
}
