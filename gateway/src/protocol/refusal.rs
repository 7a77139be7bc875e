//! Why a request cannot be said in a target's protocol: what every
//! protocol's reader refuses with, and the bounds on what it reads
//! ([`super::bounds`]) too. Below both, so neither imports the other.

/// Why a request cannot be said in a target's protocol: the field and
/// the reason, told to the client as a 400 (a reader of any protocol
/// gives it; nothing is sent).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refusal(String);

impl From<String> for Refusal {
    fn from(why: String) -> Self {
        Refusal(why)
    }
}

/// A [`Refusal`] from `format!` arguments.
macro_rules! refusal {
    ($($arg:tt)*) => {
        $crate::protocol::refusal::Refusal::from(format!($($arg)*))
    };
}
pub(crate) use refusal;

impl From<&str> for Refusal {
    fn from(why: &str) -> Self {
        Refusal(why.to_owned())
    }
}
