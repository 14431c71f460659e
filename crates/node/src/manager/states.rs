//! What the node asks of a channel's coarse state, in one place.
//!
//! The channel crate is gaining these answers itself (`State::is_opening`, `is_finished`,
//! `is_updating`, `name`, issue 29); until that lands, these are the node's only copies,
//! so the swap is one file.

use channel::State;

/// Closed cooperatively or on chain: nothing more happens on the channel itself.
pub(crate) fn is_finished(state: State) -> bool {
    matches!(state, State::Closed | State::OnChain)
}

/// States from before the anchor can be on chain: a lost session abandons the channel.
pub(crate) fn is_opening(state: State) -> bool {
    matches!(
        state,
        State::Init
            | State::OpenWaitOpen
            | State::OpenWaitAnchorTx
            | State::OpenWaitAnchor
            | State::OpenWaitCommitSig
    )
}

/// States of an update in flight (between a proposal and the last revocation).
pub(crate) fn is_updating(state: State) -> bool {
    matches!(
        state,
        State::WaitAccept | State::WaitSignature | State::WaitComplete
    )
}

/// Past the opening and not over: the channel moves money (or waits to, mid-update).
pub(crate) fn is_running(state: State) -> bool {
    !is_opening(state) && !is_finished(state) && state != State::OpenWaitComplete
}

/// The name of a state in JSON and logs (snake case).
pub(crate) fn name(state: State) -> &'static str {
    match state {
        State::Init => "init",
        State::OpenWaitOpen => "open_wait_open",
        State::OpenWaitAnchorTx => "open_wait_anchor_tx",
        State::OpenWaitAnchor => "open_wait_anchor",
        State::OpenWaitCommitSig => "open_wait_commit_sig",
        State::OpenWaitComplete => "open_wait_complete",
        State::Normal => "normal",
        State::WaitAccept => "wait_accept",
        State::WaitSignature => "wait_signature",
        State::WaitComplete => "wait_complete",
        State::CloseWaitComplete => "close_wait_complete",
        State::CloseWaitAck => "close_wait_ack",
        State::Closed => "closed",
        State::OnChain => "on_chain",
    }
}
