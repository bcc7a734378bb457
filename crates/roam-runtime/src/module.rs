//! A prepared, compiled module and what the runtime needs to know about it.

use roam_snapshot::InitialImage;
use wasmtime::{ExternType, Module};

use crate::error::LoadError;

/// Asyncify's exports, which `roam prepare` guarantees.
pub(crate) const ASYNCIFY_EXPORTS: [&str; 5] = [
    "asyncify_start_unwind",
    "asyncify_stop_unwind",
    "asyncify_start_rewind",
    "asyncify_stop_rewind",
    "asyncify_get_state",
];

/// A prepared module, compiled for this ISA.
pub struct LoadedModule {
    bytes: Vec<u8>,
    hash: [u8; 32],
    module: Module,
    initial: InitialImage,
    globals: Vec<String>,
    /// Compiled with epoch checks (on the runtime's engine that has them).
    epoch_checks: bool,
    /// Prepared with `--capture eh`.
    eh: bool,
}

impl LoadedModule {
    pub(crate) fn new(
        bytes: Vec<u8>,
        hash: [u8; 32],
        module: Module,
        epoch_checks: bool,
    ) -> Result<Self, LoadError> {
        let eh = module.get_export(roam_prepare::REWIND_EXPORT).is_some();
        let capture: &[&str] = if eh {
            &[
                roam_prepare::REWIND_EXPORT,
                roam_prepare::STATE_EXPORT,
                roam_prepare::CAPTURE_GLOBAL_EXPORT,
                roam_prepare::CAPTURE_END_EXPORT,
            ]
        } else {
            &ASYNCIFY_EXPORTS
        };
        for name in capture
            .iter()
            .chain([&"_start", &roam_prepare::FLAG_GLOBAL_EXPORT])
        {
            if module.get_export(name).is_none() {
                return Err(LoadError::MissingExport((*name).to_string()));
            }
        }
        let memory_ok = module.exports().any(|e| {
            e.name() == roam_prepare::MEMORY_EXPORT && matches!(e.ty(), ExternType::Memory(_))
        });
        if !memory_ok {
            return Err(LoadError::MissingExport(
                roam_prepare::MEMORY_EXPORT.to_string(),
            ));
        }
        let globals = module
            .exports()
            .filter(|e| e.name().starts_with(roam_prepare::GLOBAL_EXPORT_PREFIX))
            .map(|e| e.name().to_string())
            .collect();
        let (min_bytes, segments) = roam_prepare::initial_memory(&bytes)?;
        Ok(LoadedModule {
            initial: InitialImage::new(min_bytes, segments),
            bytes,
            hash,
            module,
            globals,
            epoch_checks,
            eh,
        })
    }

    /// Whether the module was prepared with `--capture eh` (its stack
    /// unwinds by a Wasm exception; see `crate::unwind`).
    pub fn captures_by_exceptions(&self) -> bool {
        self.eh
    }

    /// Whether the code checks the engine's epoch at every loop header and
    /// function entry, so that a kill ends it anywhere (see
    /// [`crate::RuntimeConfig::epoch_interrupt`]).
    pub fn epoch_checks(&self) -> bool {
        self.epoch_checks
    }

    /// The engine whose epoch a kill bumps, when the code checks it.
    pub(crate) fn epoch_engine(&self) -> Option<wasmtime::Engine> {
        self.epoch_checks.then(|| self.module.engine().clone())
    }

    /// The prepared module's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// blake3 of the prepared bytes: the module's identity in snapshots.
    pub fn hash(&self) -> &[u8; 32] {
        &self.hash
    }

    /// The compiled module.
    pub fn module(&self) -> &Module {
        &self.module
    }

    /// The initial linear-memory image, against which snapshots elide pages.
    pub fn initial_image(&self) -> &InitialImage {
        &self.initial
    }

    /// Export names of the mutable globals a snapshot must carry.
    pub fn global_exports(&self) -> &[String] {
        &self.globals
    }
}
