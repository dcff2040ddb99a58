// cgt.vocabulary — the words the user's surface (module cgt, which re-exports this module) and the
// engine (module cgt.core) both speak: errors, the version, options, what a pool tells about
// itself, element types and layouts. Plain values and their names, nothing that reaches a pool;
// a program imports it through `import cgt;`.
module;
export module cgt.vocabulary;

export import :error;    // Errc, Error, Cause, Result<T>, fail
export import :version;  // Version, version, version_string: which cgt this is
export import :options;  // Options, FunctionOptions, Reason, Event, LogSink, Buckets, Pad, SizeSource
export import :info;     // Stats, MemoryInfo, Block, CallKind, NodeKind, NodeReason, GraphCounts, PathIndex
export import :layout;   // ElementType, Layout: strided views, for the host and cuda backends' buffers
