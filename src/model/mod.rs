//! Pure types: identifiers, canonical JSON and digests, the tool call, and the
//! state machine. Nothing here touches storage or the network, so everything
//! here is unit-tested inline.

pub mod call;
pub mod canonical;
pub mod digest;
pub mod ids;
pub mod monotonic;
pub mod record;
pub mod status;
pub mod text;

pub use call::{Provider, ToolCall};
pub use canonical::{JsonError, JsonLimits};
pub use digest::{as_version_3_parsed, digest_arguments, digest_with, CanonicalArgs, DigestScheme};
pub use ids::{
    ArgsDigest, DownstreamKey, ExecutionId, ExecutionIdParts, IdError, OperationId, SessionId,
};
pub use monotonic::Monotonic;
pub use record::{EvidenceEntry, ExecutionRecord, TransitionEntry};
pub use status::{
    check_transition, ExecutionStatus, InvalidTransition, Move, OperationStatus, Transition,
};
