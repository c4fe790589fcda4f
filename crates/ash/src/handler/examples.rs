//! Example handlers (placeholder for compile)
