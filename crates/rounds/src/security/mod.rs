//! Who may do what, and how often: password hashing, session tokens, the admin key, the login throttle and the registration quota.

pub mod admin_key;
pub mod password;
pub mod quota;
pub mod throttle;
pub mod token;
