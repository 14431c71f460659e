//! The failure record of one login-throttle key: what several processes share through the store (the rules that update it are in `security::throttle`).

/// The failure record of one key: what several processes share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Failures<T> {
    /// Failures counted (not decayed).
    pub failures: u32,
    /// The last failure.
    pub last_failure: T,
    /// The key is locked until then.
    pub locked_until: T,
}
