//! Cranelift JIT of the trie.
