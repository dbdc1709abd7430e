//! The coordinator's one error type.

use thiserror::Error;

/// Everything the coordinator can refuse or fail at.
#[derive(Debug, Error)]
pub enum CoordError {
    /// The spec table is malformed; the text names the group and field.
    #[error("spec table: {0}")]
    Spec(String),
    /// A spec file could not be read or parsed.
    #[error("spec file {path}: {why}")]
    SpecFile {
        /// The file.
        path: String,
        /// What went wrong.
        why: String,
    },
    /// A request the coordinator cannot answer (empty prompt, unknown group,
    /// out-of-range position, ...). Never turned into a hit.
    #[error("bad request: {0}")]
    BadRequest(RequestError),
    /// An `[identity]` field is malformed.
    #[error("spec table: identity field `{field}`: {why}")]
    Identity {
        /// The field (`extra`, `groups.NAME`, `revision`, ...).
        field: String,
        /// What is wrong with it.
        why: &'static str,
    },
    /// A store operation failed.
    #[error(transparent)]
    Store(#[from] ucm_store::StoreError),
}

/// What a caller asked that the coordinator cannot do. Each variant
/// carries what a caller needs to tell the cases apart; its `Display` is
/// the message.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum RequestError {
    /// The prompt has no token.
    #[error("empty prompt")]
    EmptyPrompt,
    /// The prompt is shorter than one block of the chain grid.
    #[error("a prompt of {tokens} tokens is shorter than one block of the chain grid ({grid} tokens): nothing can hit")]
    PromptShorterThanGrid {
        /// Its tokens.
        tokens: u64,
        /// The chain grid.
        grid: u64,
    },
    /// The request's hashes belong to another spec table.
    #[error("the request's hashes were computed for another spec table")]
    ForeignHashes,
    /// A group's ids do not match its blocks.
    #[error("group `{group}`: {ids} ids for {blocks} blocks")]
    IdCount {
        /// The group.
        group: String,
        /// Ids given.
        ids: u64,
        /// Blocks of the prompt.
        blocks: u64,
    },
    /// A group has no view (a spec table bug).
    #[error("group `{group}` has no view")]
    NoView {
        /// The group.
        group: String,
    },
    /// No group of that name.
    #[error("unknown group `{name}`")]
    UnknownGroup {
        /// The name asked (cut to 80 characters).
        name: String,
    },
    /// A request the scheduler does not know (or no longer knows).
    #[error("unknown request `{request}` (get_num_new_matched_tokens first)")]
    UnknownRequest {
        /// The request.
        request: String,
    },
    /// The engine's computed and external tokens are not `p*`.
    #[error("request `{request}`: {computed} computed + {external} external tokens is not the matched prefix of {matched}")]
    NotTheMatchedPrefix {
        /// The request.
        request: String,
        /// Tokens the engine computed.
        computed: u64,
        /// External tokens it was told of.
        external: u64,
        /// `p*`.
        matched: u64,
    },
    /// The engine gave a group fewer blocks than the request needs.
    #[error("request `{request}`: group `{group}` needs {need} engine blocks")]
    TooFewEngineBlocks {
        /// The request.
        request: String,
        /// The group.
        group: String,
        /// Blocks needed.
        need: u64,
    },
    /// A snapshot group of the request has no state slot.
    #[error("request `{request}`: group `{group}` needs a state slot")]
    NoStateSlot {
        /// The request.
        request: String,
        /// The group.
        group: String,
    },
    /// A step of a request whose allocation was never reported.
    #[error("request `{request}`: update_state_after_alloc was not called")]
    NotAllocated {
        /// The request.
        request: String,
    },
    /// Extended tokens that do not begin with the known ones.
    #[error("request `{request}`: extended tokens do not begin with its {known} known tokens")]
    ExtensionDiverges {
        /// The request.
        request: String,
        /// Tokens known before.
        known: u64,
    },
    /// A scheduled chunk outside the request's tokens.
    #[error("request `{request}`: chunk [{start}, {end}) outside its {tokens} tokens")]
    ChunkOutside {
        /// The request.
        request: String,
        /// Chunk start.
        start: u64,
        /// Chunk end.
        end: u64,
        /// The request's tokens.
        tokens: u64,
    },
    /// Step metadata that does not fit its request.
    #[error("request `{request}`: {problem}")]
    Meta {
        /// The request.
        request: String,
        /// What does not fit.
        problem: MetaProblem,
    },
    /// A pipeline stage whose end precedes its start.
    #[error("pipeline stage {start}..{end} ends before it starts")]
    StageReversed {
        /// First layer.
        start: u32,
        /// One past the last.
        end: u32,
    },
    /// A TP rank outside the TP size.
    #[error("rank {rank} of a TP size of {tp_size}")]
    RankOutOfRange {
        /// The rank.
        rank: u32,
        /// The TP size.
        tp_size: u32,
    },
    /// A layer the engine never registered.
    #[error("layer {layer} (group `{group}`) is not registered")]
    LayerNotRegistered {
        /// The layer (the first of its unit).
        layer: u32,
        /// Its group.
        group: String,
    },
    /// A registered stride too small for the layer's shard.
    #[error("layer {layer}: a stride of {stride} bytes cannot hold a shard of {need}")]
    StrideTooSmall {
        /// The layer.
        layer: u32,
        /// The stride registered.
        stride: u64,
        /// The shard's bytes.
        need: u64,
    },
    /// No seed for a rank of a group.
    #[error("no seed for rank {rank} of group `{group}`")]
    NoSeed {
        /// The rank.
        rank: u32,
        /// The group.
        group: String,
    },
    /// A layer index the spec table does not have.
    #[error("layer {layer} is not a layer of the spec table")]
    NotALayer {
        /// The layer.
        layer: u32,
    },
    /// A layer of another pipeline stage.
    #[error("layer {layer} is not in this worker's stage {stage:?}")]
    LayerOutsideStage {
        /// The layer.
        layer: u32,
        /// The worker's stage.
        stage: std::ops::Range<u32>,
    },
    /// A worker hook called before the step started.
    #[error("{hook} before start_load_kv")]
    HookBeforeStart {
        /// The hook.
        hook: &'static str,
    },
    /// A checkpoint position past the hashed tokens.
    #[error("checkpoint position {position} lies beyond the {hashed} hashed tokens")]
    CheckpointBeyondTokens {
        /// The position.
        position: u64,
        /// Tokens hashed.
        hashed: u64,
    },
    /// A TP size of zero.
    #[error("tp_size must be positive")]
    ZeroTpSize,
    /// A user-named file that could not be read as text.
    #[error("{}: {why}", path.display())]
    UnreadableFile {
        /// The file.
        path: std::path::PathBuf,
        /// Why (too large, not a regular file, not UTF-8).
        why: String,
    },
    /// A path that must be a regular file is something else.
    #[error("{}: not a regular file", path.display())]
    NotARegularFile {
        /// The path.
        path: std::path::PathBuf,
    },
    /// Text that is not an identity digest.
    #[error("`{text}` is not an identity digest (32 lowercase hex digits)")]
    NotADigest {
        /// The text (cut to 80 characters).
        text: String,
    },
    /// A store directory without that identity.
    #[error("{} holds no identity {digest}", dir.display())]
    NoSuchIdentity {
        /// The directory.
        dir: std::path::PathBuf,
        /// The digest.
        digest: String,
    },
}

/// What in a step's metadata does not fit its request
/// ([`RequestError::Meta`]).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum MetaProblem {
    /// The load's `p*` or held tokens lie outside the request.
    #[error("load to {p} with {have} tokens held does not lie within its {tokens} tokens")]
    LoadOutside {
        /// `p*`.
        p: u64,
        /// Tokens the engine holds.
        have: u64,
        /// The request's tokens.
        tokens: u64,
    },
    /// Ids for more groups than the spec table has.
    #[error("ids of more groups than the spec table has")]
    IdsOfUnknownGroups,
    /// Ids past a group's blocks.
    #[error("ids of group `{group}` past its {blocks} blocks")]
    IdsPastBlocks {
        /// The group.
        group: String,
        /// Its blocks.
        blocks: usize,
    },
    /// A group index the spec table does not have.
    #[error("group {group} is not in the spec table")]
    UnknownGroup {
        /// The index.
        group: usize,
    },
    /// Saved blocks past a group's blocks.
    #[error("saves blocks {start}..{end} of group `{group}`, past its {blocks} blocks")]
    SavesPastBlocks {
        /// The group.
        group: String,
        /// First block.
        start: usize,
        /// One past the last.
        end: usize,
        /// Its blocks.
        blocks: usize,
    },
    /// A state saved in a group that holds none.
    #[error("group {group} is not a snapshot group")]
    NotASnapshotGroup {
        /// The index.
        group: usize,
    },
    /// A state saved past the request's tokens.
    #[error("saves a state at {position} past its {tokens} tokens")]
    StatePastTokens {
        /// The position.
        position: u64,
        /// The request's tokens.
        tokens: u64,
    },
}

/// The coordinator's result type.
pub type Result<T> = std::result::Result<T, CoordError>;
