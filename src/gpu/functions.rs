//! The kernels of one loaded CUDA module by name: each looked up in the module once, then
//! taken from a cache (a lookup is a driver call; the codecs launch the same few kernels on
//! every operation).

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaFunction, CudaModule};

use crate::error::{Error, Result};

/// A module's kernels, loaded on first use.
pub(crate) struct Functions {
    module: Arc<CudaModule>,
    loaded: HashMap<String, CudaFunction>,
    /// What the module is, for errors ("cuszi kernel cz_scan: ...").
    what: &'static str,
}

impl Functions {
    /// The kernels of `module`, named `what` in errors.
    pub(crate) fn new(module: Arc<CudaModule>, what: &'static str) -> Self {
        Functions {
            module,
            loaded: HashMap::new(),
            what,
        }
    }

    /// Kernel `name` ([`Error::Gpu`] when the module has none of that name).
    pub(crate) fn get(&mut self, name: &str) -> Result<CudaFunction> {
        if let Some(f) = self.loaded.get(name) {
            return Ok(f.clone());
        }
        let f = self
            .module
            .load_function(name)
            .map_err(|e| Error::Gpu(format!("{} kernel {name}: {e:?}", self.what)))?;
        self.loaded.insert(name.to_string(), f.clone());
        Ok(f)
    }
}
