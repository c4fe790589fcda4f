//! Front end for the common tcpdump filter syntax.
use crate::{DpfError, Filter};

/// Compiles a tcpdump expression into the conjunctions whose disjunction it is.
pub fn compile(expr: &str) -> Result<Vec<Filter>, DpfError> {
    Err(DpfError::Unsupported(format!("tcpdump syntax not yet built: {expr}")))
}
