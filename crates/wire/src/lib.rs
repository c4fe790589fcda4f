//! Frame views.
