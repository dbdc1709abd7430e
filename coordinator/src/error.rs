//! The coordinator's one error type.

use thiserror::Error;

use crate::group::{AccessUnit, Kind, MAX_LAYERS};

/// Everything the coordinator can refuse or fail at.
#[derive(Debug, Error)]
pub enum CoordError {
    /// The spec table is malformed: which group and field, and how.
    #[error("spec table: {0}")]
    Spec(SpecError),
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

/// What is wrong with a spec table ([`CoordError::Spec`]).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum SpecError {
    /// The model name is empty.
    #[error("the model name is empty")]
    EmptyModel,
    /// The table has no group.
    #[error("no groups")]
    NoGroups,
    /// `num_layers` is too large.
    #[error("num_layers must not exceed {max}")]
    TooManyLayers {
        /// The bound.
        max: u32,
    },
    /// A group name that cannot name a directory.
    #[error("group {index}: {why}")]
    BadGroupName {
        /// The row.
        index: usize,
        /// Why (the store's name rule).
        why: ucm_store::NameError,
    },
    /// One group's row is wrong.
    #[error("group `{group}`: {problem}")]
    Group {
        /// The group.
        group: String,
        /// How.
        problem: GroupProblem,
    },
    /// Two groups claim a layer.
    #[error("layer {layer} is in two groups: `{first}` and `{second}`")]
    LayerInTwoGroups {
        /// The layer.
        layer: u32,
        /// The group that had it first.
        first: String,
        /// The other.
        second: String,
    },
    /// No chain group: nothing could ever hit.
    #[error("no chain group: a hit is a prefix the chain groups hold, so this table could never serve one")]
    NoChainGroup,
    /// The file is not a spec table in TOML (the parser's message).
    #[error("{message}")]
    Toml {
        /// The parser's message.
        message: String,
    },
    /// Pipeline stage bounds that cut a unit of layers loaded together.
    #[error("the row unit of layers {unit:?} is split across pipeline stages at {stage:?}")]
    StageSplitsUnit {
        /// The unit's layers.
        unit: Vec<u32>,
        /// The stage that holds part of it.
        stage: std::ops::Range<u32>,
    },
    /// Pipeline stage bounds that do not rise strictly inside the model.
    #[error("pipeline stage bounds {bounds:?} must rise strictly inside 0..{num_layers}")]
    StageBounds {
        /// The bounds.
        bounds: Vec<u32>,
        /// The model's layers.
        num_layers: u32,
    },
}

/// What is wrong with one group's row ([`SpecError::Group`]).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum GroupProblem {
    /// Two rows share the name.
    #[error("defined twice")]
    DefinedTwice,
    /// The layer list is malformed.
    #[error("{0}")]
    Layers(LayersError),
    /// The layer list is empty.
    #[error("no layers")]
    NoLayers,
    /// A layer at or past the model's `num_layers`.
    #[error("layer {layer} is not below num_layers = {num_layers}")]
    LayerPastModel {
        /// The layer.
        layer: u32,
        /// The model's layers.
        num_layers: u32,
    },
    /// A size above its bound.
    #[error("`{field}` = {value} exceeds {max}")]
    FieldTooLarge {
        /// The field.
        field: &'static str,
        /// Its value.
        value: u64,
        /// The bound.
        max: u64,
    },
    /// A field the group's kind needs is missing.
    #[error("a {kind:?} group needs `{field}`")]
    FieldMissing {
        /// The field.
        field: &'static str,
        /// The group's kind.
        kind: Kind,
    },
    /// A size of zero.
    #[error("`{field}` must be positive")]
    FieldNotPositive {
        /// The field.
        field: &'static str,
    },
    /// A field the group's kind does not take.
    #[error("`{field}` does not apply to a {kind:?} group")]
    FieldNotApplicable {
        /// The field.
        field: &'static str,
        /// The group's kind.
        kind: Kind,
    },
    /// One layer's block (block_size x bytes_per_token) above its bound.
    #[error("a block of one layer (block_size x bytes_per_token) exceeds {max} bytes")]
    LayerBlockTooLarge {
        /// The bound.
        max: u64,
    },
    /// A snapshot group without `hash_block` in a table without chains.
    #[error("no chain group to take `hash_block` from; set it")]
    NoHashBlock,
    /// A sidecar without `source`.
    #[error("a sidecar needs `source` (the chain group it follows)")]
    NoSource,
    /// A sidecar following a group the table does not have.
    #[error("follows unknown group `{followed}`")]
    UnknownSource {
        /// The name given.
        followed: String,
    },
    /// A sidecar following a group that is not a chain.
    #[error("follows `{followed}`, a {kind:?} group; a source must be a chain group")]
    SourceNotChain {
        /// The group followed.
        followed: String,
        /// Its kind.
        kind: Kind,
    },
    /// A sidecar with another access unit than follower.
    #[error("access unit {unit:?}; sidecars are followers")]
    SidecarUnit {
        /// The unit given.
        unit: AccessUnit,
    },
    /// A follower unit on a group that is not a sidecar.
    #[error("only sidecars are followers")]
    FollowerNotSidecar,
    /// Window units on a chain group without a window.
    #[error("access unit window needs a `window`")]
    WindowUnitWithoutWindow,
    /// Window units on a group that is not a chain.
    #[error("only chain groups have window units")]
    WindowUnitNotChain,
}

/// What is wrong with a layer list ([`GroupProblem::Layers`]).
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum LayersError {
    /// A layer index at or above the bound.
    #[error("layer {layer}{} is not below {MAX_LAYERS}", in_list(.layers))]
    TooHigh {
        /// The index as written.
        layer: String,
        /// The list it is in, where written as ranges.
        layers: Option<String>,
    },
    /// More layers than the bound.
    #[error("{} more than {MAX_LAYERS} layers", listed(.layers))]
    TooMany {
        /// The list, where written as ranges.
        layers: Option<String>,
    },
    /// Text that is not a layer index.
    #[error("`{text}` in layers \"{layers}\" is not a layer index")]
    NotAnIndex {
        /// The text.
        text: String,
        /// The list.
        layers: String,
    },
    /// A range whose end precedes its start.
    #[error("range `{range}` in layers \"{layers}\" is reversed")]
    Reversed {
        /// The range.
        range: String,
        /// The list.
        layers: String,
    },
}

fn in_list(layers: &Option<String>) -> String {
    layers
        .as_ref()
        .map_or_else(String::new, |l| format!(" in layers \"{l}\""))
}

fn listed(layers: &Option<String>) -> String {
    layers.as_ref().map_or_else(
        || "a list of".to_string(),
        |l| format!("layers \"{l}\" list"),
    )
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
