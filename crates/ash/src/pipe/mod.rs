//! Dynamic ILP: pipes and pipe lists (§2.2).
