//! Pure types: identifiers, canonical JSON and digests, the tool call, and the
//! state machine. Nothing here touches storage or the network, so everything
//! here is unit-tested inline.

pub mod call;
pub mod canonical;
pub mod digest;
pub mod ids;
pub mod record;
pub mod status;

pub use call::{Provider, ToolCall};
pub use canonical::{JsonError, JsonLimits};
pub use digest::{digest_arguments, CanonicalArgs};
pub use ids::{
    ArgsDigest, DownstreamKey, ExecutionId, ExecutionIdParts, IdError, OperationId, SessionId,
};
pub use record::{ExecutionRecord, TransitionEntry};
pub use status::{
    check_transition, ExecutionStatus, InvalidTransition, OperationStatus, Transition,
};
