//! Temporary linear engine; replaced by the merged trie.
use crate::{DpfError, Engine, Filter, FilterId};

pub struct Dpf {
    rules: Vec<(FilterId, Vec<Filter>)>,
    next: u32,
    _engine: Engine,
}

impl Default for Dpf {
    fn default() -> Self {
        Dpf::new()
    }
}

impl Dpf {
    pub fn new() -> Dpf {
        Dpf::with_engine(Engine::Jit)
    }
    pub fn with_engine(engine: Engine) -> Dpf {
        Dpf { rules: Vec::new(), next: 0, _engine: engine }
    }
    pub fn insert(&mut self, f: &Filter) -> Result<FilterId, DpfError> {
        self.insert_any(std::slice::from_ref(f))
    }
    pub fn insert_any(&mut self, fs: &[Filter]) -> Result<FilterId, DpfError> {
        for f in fs {
            f.validate()?;
        }
        let id = FilterId(self.next);
        self.next += 1;
        self.rules.push((id, fs.to_vec()));
        Ok(id)
    }
    pub fn delete(&mut self, id: FilterId) -> Result<(), DpfError> {
        let n = self.rules.len();
        self.rules.retain(|r| r.0 != id);
        if n == self.rules.len() { Err(DpfError::NoSuchFilter(id)) } else { Ok(()) }
    }
    pub fn demux(&self, frame: &[u8]) -> Option<FilterId> {
        self.rules.iter().find(|r| r.1.iter().any(|f| f.matches(frame))).map(|r| r.0)
    }
    pub fn explain(&self) -> String {
        String::new()
    }
    pub fn code_size(&self) -> usize {
        0
    }
}
