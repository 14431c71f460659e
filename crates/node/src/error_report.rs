//! An error and its causes on one line, each layer's text once: for logs and for the
//! control API's messages. Our errors print only their own layer and chain the cause.

use std::error::Error;
use std::fmt;

/// Shows `error: cause: cause …`; a cause whose text its wrapper already ends with (a
/// library error that prints and chains the same error, as sqlx's does) is not repeated.
pub(crate) struct Causes<'a>(pub(crate) &'a (dyn Error + 'static));

impl fmt::Display for Causes<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut shown = self.0.to_string();
        let mut source = self.0.source();
        while let Some(cause) = source {
            let text = cause.to_string();
            if !shown.ends_with(&text) {
                shown.push_str(": ");
                shown.push_str(&text);
            }
            source = cause.source();
        }
        f.write_str(&shown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("outer")]
    struct Outer(#[source] Middle);

    /// A library error that prints its cause and chains it too (as sqlx's do).
    #[derive(Debug)]
    struct Middle(std::io::Error);

    impl fmt::Display for Middle {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "middle: {}", self.0)
        }
    }

    impl Error for Middle {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn each_layer_is_shown_once() {
        let e = Outer(Middle(std::io::Error::other("disk full")));
        assert_eq!(Causes(&e).to_string(), "outer: middle: disk full");
    }
}
