//! [`ErrorKind`]: the one vocabulary of failure kinds, as the wire (`--json`,
//! MCP, events) and the journal write them.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

macro_rules! kinds {
    ($($(#[$doc:meta])* $variant:ident = $text:literal $(| $alias:literal)*,)*) => {
        /// What kind of failure something was: a call's, a run's, a store's.
        ///
        /// Each kind has a stable `snake_case` name ([`ErrorKind::as_str`]),
        /// which is what JSON output, MCP results, the event log and the
        /// journal hold. Names are never reused for another meaning, and a
        /// name retired in favour of another still parses as it, so a
        /// journal written by an older Airlock reads the same.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum ErrorKind {
            $($(#[$doc])* $variant,)*
        }

        impl ErrorKind {
            /// Every kind, in declaration order.
            pub const ALL: &'static [ErrorKind] = &[$(ErrorKind::$variant,)*];

            /// The stable name: `timeout`, `op_rejected`, `lease_lost`, ...
            pub fn as_str(self) -> &'static str {
                match self {
                    $(ErrorKind::$variant => $text,)*
                }
            }
        }

        impl FromStr for ErrorKind {
            type Err = UnknownKind;

            fn from_str(text: &str) -> Result<Self, UnknownKind> {
                match text {
                    $($text $(| $alias)* => Ok(ErrorKind::$variant),)*
                    _ => Err(UnknownKind(crate::text::truncate(text, 64))),
                }
            }
        }
    };
}

kinds! {
    // A tool call's (`CallError::kind`).
    /// No loaded tool has the name.
    UnknownTool = "unknown_tool",
    /// The arguments were refused: by the host before the tool ran (not
    /// a JSON object, or outside the tool's parameter schema), or by the
    /// tool (`invalid-args`). Journals of older versions, which named the
    /// host's refusal `bad_arguments`, read as this kind.
    InvalidArgs = "invalid_args" | "bad_arguments",
    /// The tool reported that it failed.
    Failed = "failed",
    /// The tool asks the model to try again.
    Retry = "retry",
    /// The call ran past its timeout.
    Timeout = "timeout",
    /// The call or the run was cancelled.
    Cancelled = "cancelled",
    /// The guest needed more memory than allowed.
    MemoryLimit = "memory_limit",
    /// The guest grew a table past its limit.
    TableLimit = "table_limit",
    /// The guest used up its fuel.
    FuelExhausted = "fuel_exhausted",
    /// The guest wrote too much output.
    OutputLimit = "output_limit",
    /// The guest trapped.
    Trap = "trap",
    /// The result was over its limit.
    ResultTooLarge = "result_too_large",
    /// The result was not JSON (or its legacy update was malformed).
    InvalidResult = "invalid_result",
    /// An op was rejected, and with it the call.
    OpRejected = "op_rejected",
    /// A grant could not be prepared for the call.
    GrantUnavailable = "grant_unavailable",
    /// The guest held too many host resources at once.
    ResourceLimit = "resource_limit",
    /// No room in the instance pool.
    Busy = "busy",
    // The journal's.
    /// A call that was asked for and never answered (the process died, or
    /// the run ended first); recorded when its session is next opened.
    Interrupted = "interrupted",
    // A run's (`RunError::kind`).
    /// The model made too many requests without an answer.
    MaxIterations = "max_iterations",
    /// A model request failed.
    ModelError = "model_error",
    /// The run's transcript outgrew its bound.
    TranscriptTooLarge = "transcript_too_large",
    // A session store's (`StoreError::kind`).
    /// Another run holds the session.
    SessionInUse = "session_in_use",
    /// No such session for this owner.
    SessionNotFound = "session_not_found",
    /// The owner already has a session with that id.
    SessionExists = "session_exists",
    /// The lease was taken over; nothing more was saved.
    LeaseLost = "lease_lost",
    /// The stored journal does not fold.
    SessionDamaged = "session_damaged",
    /// The store is not one this Airlock can use (not a database, damaged,
    /// another program's, or newer).
    InvalidStore = "invalid_store",
    /// The store's backend failed.
    StoreError = "store_error",
    /// A session or user id that cannot be used.
    InvalidId = "invalid_id",
}

/// A kind name this Airlock does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown error kind {0:?}")]
pub struct UnknownKind(String);

impl fmt::Display for ErrorKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for ErrorKind {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for ErrorKind {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = std::borrow::Cow::<'de, str>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kind_reads_back_from_its_name_and_names_are_unique() {
        let mut seen = std::collections::BTreeSet::new();
        for kind in ErrorKind::ALL {
            assert!(seen.insert(kind.as_str()), "{kind} named twice");
            assert_eq!(kind.as_str().parse::<ErrorKind>(), Ok(*kind));
            let json = serde_json::to_string(kind).unwrap();
            assert_eq!(serde_json::from_str::<ErrorKind>(&json).unwrap(), *kind);
        }
        assert!("bogus".parse::<ErrorKind>().is_err());
    }
}
