//! The one coarse state question only the node asks; the channel answers the others itself
//! (`State::is_opening`, `is_finished`, `is_updating`, `as_str`).

use channel::State;

/// Past the opening and not over: the channel moves money (or waits to, mid-update).
pub(crate) fn is_running(state: State) -> bool {
    !state.is_opening() && !state.is_finished() && state != State::OpenWaitComplete
}
