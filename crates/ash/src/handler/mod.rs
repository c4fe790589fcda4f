//! WebAssembly handlers.
