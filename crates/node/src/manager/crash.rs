//! Test-only crash points of forwarding (issue 30): the node dies right after one of a
//! forward's durable writes, before anything that depends on it happens, so that tests
//! can show that a restart from disk resolves every HTLC. Compiled in only for the
//! crate's tests and the `test-hooks` feature; a release build has none.
//!
//! In the crate's tests the node stops dead in process: its sessions are dropped without a
//! goodbye (what it queued before the point still leaves, as a killed process's socket
//! flushes), no further packet is read, and the task that reached the point never goes
//! on. The binary (`test-hooks`, `POTLUCK_TEST_CRASH_AT`) kills itself with SIGKILL
//! instead, once the packets queued before the point had time to leave (the kernel sends
//! what a killed process wrote to its sockets; a packet still in the node's own queue is
//! the lost-session rule's case).

use super::Manager;

/// A step of a forward after which the node can be made to die (docs/node.md, "Crash
/// safety of a forward").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(not(any(test, feature = "test-hooks")), allow(dead_code))]
pub(crate) enum CrashStep {
    /// The forward link is stored; the downstream offer has not left.
    ForwardStored,
    /// The downstream HTLC is committed (our offer's update completed); nothing yet from
    /// the next hop.
    DownstreamCommitted,
    /// The downstream outcome (R, or the failure) is stored; the upstream fulfil or
    /// routefail has not left.
    OutcomeStored,
    /// The upstream fulfil or routefail is committed (its update completed).
    UpstreamCommitted,
}

impl CrashStep {
    /// Every step, in the order a forward passes them.
    #[cfg(test)]
    pub(crate) const ALL: [CrashStep; 4] = [
        CrashStep::ForwardStored,
        CrashStep::DownstreamCommitted,
        CrashStep::OutcomeStored,
        CrashStep::UpstreamCommitted,
    ];

    /// The name `POTLUCK_TEST_CRASH_AT` (and `NodeConfig::crash_at`) gives it.
    #[cfg_attr(not(any(test, feature = "test-hooks")), allow(dead_code))]
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            CrashStep::ForwardStored => "forward_stored",
            CrashStep::DownstreamCommitted => "downstream_committed",
            CrashStep::OutcomeStored => "outcome_stored",
            CrashStep::UpstreamCommitted => "upstream_committed",
        }
    }
}

impl Manager {
    /// Dies here if the settings name `step`.
    #[cfg(any(test, feature = "test-hooks"))]
    pub(crate) async fn crash_point(&self, step: CrashStep) {
        if self.settings.crash_at.as_deref() != Some(step.as_str()) {
            return;
        }
        tracing::warn!(step = step.as_str(), "test crash point: the node dies here");
        #[cfg(test)]
        {
            self.crashed.send_replace(true);
            self.peers.vanish();
            // The task that got here never goes on (if it is a session's, vanish aborted
            // it and it ends at this await).
            std::future::pending::<()>().await;
        }
        #[cfg(not(test))]
        {
            self.peers.queued_sent().await;
            let pid = std::process::id().to_string();
            if let Err(e) = std::process::Command::new("kill")
                .args(["-9", &pid])
                .status()
            {
                tracing::error!(error = %e, "cannot run kill -9");
            }
            // `kill` should not return; if it is missing, die anyway.
            std::process::abort();
        }
    }

    /// Without test hooks a crash point is nothing.
    #[cfg(not(any(test, feature = "test-hooks")))]
    #[inline(always)]
    pub(crate) async fn crash_point(&self, _step: CrashStep) {}

    /// Whether the node died at a crash point (in-process tests).
    #[cfg(test)]
    pub(crate) fn crashed(&self) -> tokio::sync::watch::Receiver<bool> {
        self.crashed.subscribe()
    }
}
