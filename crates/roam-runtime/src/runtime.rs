//! The [`Runtime`]: wasmtime engines and one cache, shared by every cell a
//! process runs.
//!
//! Two engines, which differ only in epoch interruption: a kill must end a
//! program that reaches no migration point ([`crate::control`]), and only
//! wasmtime's epoch checks can; but they cost up to 2x on hot loops (matmul,
//! linpack at size M). A module prepared with the `loops` policy reaches a
//! point within straight-line code, so a kill ends it at its next point and
//! it runs on the engine without epoch checks. Modules prepared with
//! `outer`, `functions` or `manual`, which may run for ever between points,
//! run on the engine with them. [`RuntimeConfig::epoch_interrupt`]
//! overrides the choice.

use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use roam_prepare::{PointPolicy, PrepareOptions};
use wasmtime::{Config, Engine, Module};

use crate::cache::{hex, Cache};
use crate::error::{boxed, LoadError};
use crate::memory::Creator;
use crate::module::LoadedModule;

/// The ISA this process runs on, as recorded in snapshots and cache keys.
pub fn host_isa() -> &'static str {
    std::env::consts::ARCH
}

/// How to build a [`Runtime`].
#[derive(Debug, Clone)]
pub struct RuntimeConfig {
    /// Where prepared modules and compiled code are cached.
    /// Default: [`Cache::default_dir`].
    pub cache_dir: PathBuf,
    /// How unprepared modules are prepared on the fly. Default: loops policy.
    pub prepare: PrepareOptions,
    /// Most native stack the program's wasm frames may use. Default
    /// [`DEFAULT_MAX_WASM_STACK`]: Asyncify-instrumented frames are larger
    /// than plain ones, so wasmtime's own default (512 KiB) is too tight
    /// for deep recursion. The thread that calls [`crate::Cell::run`] needs
    /// this much stack plus room for the host (see [`RUN_THREAD_STACK`]).
    pub max_wasm_stack: usize,
    /// Which modules are compiled with wasmtime's epoch checks, which let
    /// [`crate::Controller::kill`] end a program that reaches no migration
    /// point (see the module docs). Default: [`EpochInterrupt::from_env`].
    pub epoch_interrupt: EpochInterrupt,
}

/// Which modules get epoch checks (a load and a compare at every loop header
/// and function entry, so that a kill ends them wherever they are).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EpochInterrupt {
    /// Modules whose point policy does not bound the time to the next
    /// point (`outer`, `functions`, `manual`); `loops` modules run without.
    #[default]
    ByPolicy,
    /// Every module: a kill also ends a hand-made module whose `roam`
    /// section claims the `loops` policy without its points.
    Always,
    /// None: a kill ends a program only at its next migration point or
    /// blocking call (for measuring what the checks cost).
    Never,
}

impl EpochInterrupt {
    /// From [`ENV_EPOCH_INTERRUPT`]: `1` [`Always`](Self::Always), `0`
    /// [`Never`](Self::Never), unset or anything else
    /// [`ByPolicy`](Self::ByPolicy).
    pub fn from_env() -> Self {
        match std::env::var_os(ENV_EPOCH_INTERRUPT) {
            Some(v) if v == "1" => EpochInterrupt::Always,
            Some(v) if v == "0" => EpochInterrupt::Never,
            _ => EpochInterrupt::ByPolicy,
        }
    }

    /// Whether a module prepared with `points` gets epoch checks.
    pub fn applies_to(self, points: PointPolicy) -> bool {
        match self {
            EpochInterrupt::Always => true,
            EpochInterrupt::Never => false,
            EpochInterrupt::ByPolicy => points != PointPolicy::Loops,
        }
    }
}

/// Environment variable that sets [`RuntimeConfig::epoch_interrupt`]: `1`
/// for every module, `0` for none (see [`EpochInterrupt::from_env`]).
pub const ENV_EPOCH_INTERRUPT: &str = "ROAM_EPOCH_INTERRUPT";

/// Default for [`RuntimeConfig::max_wasm_stack`].
pub const DEFAULT_MAX_WASM_STACK: usize = 16 << 20;

/// Stack size for a thread that runs cells with the default configuration.
pub const RUN_THREAD_STACK: usize = 64 << 20;

impl Default for RuntimeConfig {
    fn default() -> Self {
        RuntimeConfig {
            cache_dir: Cache::default_dir(),
            prepare: PrepareOptions {
                capture: roam_prepare::Capture::from_env().unwrap_or_else(|e| {
                    tracing::warn!("{}: {e}; using the default", roam_prepare::ENV_CAPTURE);
                    roam_prepare::Capture::default()
                }),
                ..PrepareOptions::default()
            },
            max_wasm_stack: DEFAULT_MAX_WASM_STACK,
            epoch_interrupt: EpochInterrupt::from_env(),
        }
    }
}

/// One engine and the compiled-code cache key of its configuration.
#[derive(Clone)]
struct Keyed {
    engine: Engine,
    key: u64,
}

/// The wasmtime engines configured for roam, plus the module cache.
#[derive(Clone)]
pub struct Runtime {
    /// Without epoch checks.
    plain: Keyed,
    /// With them, for modules that may never reach a point.
    checked: Keyed,
    cache: Cache,
    prepare: PrepareOptions,
    memories: Arc<Creator>,
    epoch_interrupt: EpochInterrupt,
}

impl Runtime {
    /// Build the engines: Cranelift at its default optimisation, linear
    /// memories mapped by roam (one creator for both), one engine without
    /// and one with epoch interruption (the host raises the migration flag
    /// through [`crate::flag`] either way; the epoch only ends killed
    /// programs). The two compile different code; the engine's
    /// compatibility hash, part of the compiled-code cache key, tells them
    /// apart.
    pub fn new(cfg: RuntimeConfig) -> Result<Self, LoadError> {
        let memories = Arc::new(Creator::default());
        let plain = engine(&cfg, &memories, false)?;
        let checked = engine(&cfg, &memories, true)?;
        let cache = Cache::open(&cfg.cache_dir).map_err(|source| LoadError::Cache {
            dir: cfg.cache_dir.clone(),
            source,
        })?;
        Ok(Runtime {
            plain,
            checked,
            cache,
            prepare: cfg.prepare,
            memories,
            epoch_interrupt: cfg.epoch_interrupt,
        })
    }

    /// The engine for modules without epoch checks (a loaded module's own
    /// engine is `module.module().engine()`).
    pub fn engine(&self) -> &Engine {
        &self.plain.engine
    }

    /// The cache.
    pub fn cache(&self) -> &Cache {
        &self.cache
    }

    /// The memory creator that maps every cell's linear memory.
    pub(crate) fn memories(&self) -> &Creator {
        &self.memories
    }

    /// The memory creator, to keep beyond a borrow of the runtime.
    pub(crate) fn memory_creator(&self) -> Arc<Creator> {
        self.memories.clone()
    }

    /// Load a module file, preparing it first (and caching the result by
    /// content hash) when it is not prepared yet.
    pub fn load_file(&self, path: &Path) -> Result<Arc<LoadedModule>, LoadError> {
        let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        self.load_bytes(&bytes)
    }

    /// Load module bytes, preparing them when needed.
    pub fn load_bytes(&self, bytes: &[u8]) -> Result<Arc<LoadedModule>, LoadError> {
        let prepared = if roam_prepare::read_section(bytes)?.is_some() {
            bytes.to_vec()
        } else {
            self.prepare_cached(bytes)?
        };
        self.load_prepared(prepared)
    }

    /// Find a prepared module by hash: the embedded copy, then the cache.
    pub fn load_by_hash(
        &self,
        hash: &[u8; 32],
        embedded: Option<&[u8]>,
    ) -> Result<Arc<LoadedModule>, LoadError> {
        if let Some(bytes) = embedded {
            return self.load_prepared(bytes.to_vec());
        }
        match self.cache.get(&self.cache.module_path(hash)) {
            Some(bytes) if *blake3::hash(&bytes).as_bytes() == *hash => self.load_prepared(bytes),
            _ => Err(LoadError::NotFound {
                hash: hex(hash),
                dir: self.cache.root().join("modules"),
            }),
        }
    }

    fn prepare_cached(&self, source: &[u8]) -> Result<Vec<u8>, LoadError> {
        let src_hash = *blake3::hash(source).as_bytes();
        let key = format!(
            "{};revision={}",
            self.prepare.canonical(),
            roam_prepare::OUTPUT_REVISION
        );
        let path = self.cache.prepared_path(&src_hash, &key);
        if let Some(bytes) = self.cache.get(&path) {
            if roam_prepare::read_section(&bytes).ok().flatten().is_some() {
                tracing::debug!(path = %path.display(), "prepared module from cache");
                return Ok(bytes);
            }
        }
        tracing::info!("preparing module (first run of this module)");
        let prepared = roam_prepare::prepare(source, &self.prepare)?;
        if let Some(why) = &prepared.fallback {
            tracing::warn!(
                "prepared with Asyncify: capture by exceptions cannot handle this module ({why})"
            );
        }
        self.put(&path, &prepared.bytes)?;
        Ok(prepared.bytes)
    }

    fn load_prepared(&self, bytes: Vec<u8>) -> Result<Arc<LoadedModule>, LoadError> {
        // Every way in (a file, an upload, a snapshot's embedded copy, a
        // migration peer, the cache) passes here: believe no `roam` section
        // that does not match its module.
        let hash = *blake3::hash(&bytes).as_bytes();
        let section = self.checked_section(&bytes, &hash)?;
        let mpath = self.cache.module_path(&hash);
        if !mpath.exists() {
            self.put(&mpath, &bytes)?;
        }
        let checks = self.epoch_interrupt.applies_to(section.points);
        let keyed = if checks { &self.checked } else { &self.plain };
        let module = self.compile(keyed, &bytes, &hash)?;
        LoadedModule::new(bytes, hash, module, checks).map(Arc::new)
    }

    /// [`roam_prepare::check_prepared`], once per module and check
    /// revision: it validates every function, which takes a good part of a
    /// second for a large program and would otherwise be paid on each run.
    /// The mark lives in roam's own cache, trusted as the compiled code
    /// beside it is; a module that was never checked here, or checked by an
    /// older revision, is checked again.
    fn checked_section(
        &self,
        bytes: &[u8],
        hash: &[u8; 32],
    ) -> Result<roam_prepare::RoamSection, LoadError> {
        let mark = self.cache.verified_path(hash, roam_prepare::CHECK_REVISION);
        if mark.exists() {
            if let Some(section) = roam_prepare::read_section(bytes)? {
                return Ok(section);
            }
        }
        let section =
            roam_prepare::check_prepared(bytes).map_err(roam_prepare::PrepareError::from)?;
        // A mark we cannot write only costs the check on the next run.
        if let Err(e) = self.cache.put(&mark, &[]) {
            tracing::warn!("cannot record that the module passed its check: {e}");
        }
        Ok(section)
    }

    fn compile(&self, keyed: &Keyed, bytes: &[u8], hash: &[u8; 32]) -> Result<Module, LoadError> {
        let path = self.cache.compiled_path(hash, host_isa(), keyed.key);
        let sidecar = path.with_extension("blake3");
        if let (Some(code), Some(sum)) = (self.cache.get(&path), self.cache.get(&sidecar)) {
            if blake3::hash(&code).as_bytes()[..] == sum[..] {
                // SAFETY: the file is one this process family wrote into its
                // own cache for this exact engine configuration and ISA (both
                // are in the key), and its integrity hash matches, so it is
                // the unmodified output of `Module::serialize`.
                match unsafe { Module::deserialize(&keyed.engine, &code) } {
                    Ok(m) => return Ok(m),
                    Err(e) => tracing::warn!("ignoring unusable compiled cache entry: {e}"),
                }
            }
        }
        let started = std::time::Instant::now();
        let lowered = crate::flag::lower(bytes)?;
        let module = Module::new(&keyed.engine, &lowered).map_err(|e| LoadError::Compile {
            isa: host_isa().to_string(),
            source: boxed(e),
        })?;
        tracing::info!(
            isa = host_isa(),
            ms = started.elapsed().as_millis() as u64,
            "compiled module"
        );
        if let Ok(code) = module.serialize() {
            // A cache we cannot write only costs time on the next run.
            if let Err(e) = self
                .cache
                .put(&path, &code)
                .and_then(|()| self.cache.put(&sidecar, blake3::hash(&code).as_bytes()))
            {
                tracing::warn!("cannot cache compiled code: {e}");
            }
        }
        Ok(module)
    }

    fn put(&self, path: &Path, bytes: &[u8]) -> Result<(), LoadError> {
        self.cache
            .put(path, bytes)
            .map_err(|source| LoadError::Cache {
                dir: self.cache.root().to_path_buf(),
                source,
            })
    }
}

/// One of the runtime's engines, and its cache key.
fn engine(cfg: &RuntimeConfig, memories: &Arc<Creator>, epoch: bool) -> Result<Keyed, LoadError> {
    let mut config = Config::new();
    config.epoch_interruption(epoch);
    config.cranelift_opt_level(wasmtime::OptLevel::Speed);
    config.max_wasm_stack(cfg.max_wasm_stack);
    // wasmtime checks max_wasm_stack against the (unused) async stack size.
    config.async_stack_size(cfg.max_wasm_stack + (1 << 20));
    // roam maps every linear memory itself (see `crate::memory`).
    config.with_host_memory(memories.clone());
    // Copy-on-write initialisation needs wasmtime's own mmaps (it
    // panics on a module with data segments otherwise).
    config.memory_init_cow(false);
    // Threaded programs share one memory among their threads' instances
    // (`crate::threads`); the threads proposal itself is on by default.
    config.shared_memory(true);
    // `ROAM_PERFMAP=1`: wasmtime writes /tmp/perf-<pid>.map, so that
    // `perf record` names the program's functions.
    if std::env::var_os("ROAM_PERFMAP").is_some() {
        config.profiler(wasmtime::ProfilingStrategy::PerfMap);
    }
    let engine = Engine::new(&config).map_err(|e| LoadError::Compile {
        isa: host_isa().to_string(),
        source: boxed(e),
    })?;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    engine.precompile_compatibility_hash().hash(&mut h);
    crate::flag::LOWERING_VERSION.hash(&mut h);
    Ok(Keyed {
        key: h.finish(),
        engine,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_configuration_builds_an_engine() {
        let dir = tempfile::tempdir().unwrap();
        let rt = Runtime::new(RuntimeConfig {
            cache_dir: dir.path().to_path_buf(),
            ..RuntimeConfig::default()
        });
        assert!(rt.is_ok(), "{:?}", rt.err());
    }

    /// Code compiled with epoch checks and code compiled without them must
    /// never be mixed up in the cache.
    #[test]
    fn epoch_interruption_is_part_of_the_compiled_code_key() {
        let dir = tempfile::tempdir().unwrap();
        let rt = Runtime::new(RuntimeConfig {
            cache_dir: dir.path().to_path_buf(),
            ..RuntimeConfig::default()
        })
        .unwrap();
        assert_ne!(rt.plain.key, rt.checked.key);
    }

    #[test]
    fn only_policies_without_a_bound_get_epoch_checks_by_default() {
        use PointPolicy::*;
        let by = EpochInterrupt::ByPolicy;
        assert!(!by.applies_to(Loops));
        assert!([Outer, Functions, Manual].iter().all(|p| by.applies_to(*p)));
        assert!(EpochInterrupt::Always.applies_to(Loops));
        assert!(!EpochInterrupt::Never.applies_to(Manual));
    }

    #[test]
    fn unusable_cache_dir_is_a_precise_error() {
        let err = Runtime::new(RuntimeConfig {
            cache_dir: PathBuf::from("/proc/roam-cannot-create-this"),
            ..RuntimeConfig::default()
        })
        .err()
        .expect("cache under /proc must fail");
        assert!(err.to_string().contains("ROAM_CACHE_DIR"), "{err}");
    }
}
