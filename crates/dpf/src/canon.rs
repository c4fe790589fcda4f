//! Canonical form of filters.
