//! Protocol composition (§2.3).
