//! Collision-free hash tables for disjunction nodes.
