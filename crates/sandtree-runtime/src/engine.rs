//! The [`Engine`]: shared state and the helpers every verb uses.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use sandtree_api::{Limits, SandboxInfo, SandboxStatus, Usage};
use sandtree_fs::Volume;
use sandtree_meta::{DesiredState, Meta, SandboxRecord};
use sandtree_sandbox::{Sandbox, SandboxSpec, Zygote};
use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard, RwLock};

use crate::layers::{StoredLayer, overlay_layers};
use crate::{Config, Error, Result, util};

/// A sandbox's writable subvolume and the read-only layers under it.
#[derive(Clone, Debug)]
pub(crate) struct LayerStack {
    /// `<sandbox-id>/<gen>` under `sandboxes/`.
    pub subvol: String,
    /// Layers under it, top first (paths under the volume root).
    pub lowers: Vec<String>,
    /// What its disk usage counts from (see `SandboxRecord::base_transid`).
    pub base_transid: u64,
}

/// Run blocking work from async code without stalling a runtime worker.
pub(crate) fn block<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current() {
        Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// The Sandtree engine. Cheap to share (`Arc<Engine>`); every verb is `&self`.
pub struct Engine {
    pub(crate) cfg: Config,
    /// cgroup2's `favordynmods` is on: moving a task between cgroups does
    /// not wait for an RCU grace period, so the tracers keep their pools
    /// in a cgroup of their own (`sandtree-proc`'s `cgroup.rs`).
    dynmods: bool,
    pub(crate) volume: Volume,
    pub(crate) meta: Arc<Meta>,
    pub(crate) zygote: Arc<Zygote>,
    /// Running sandboxes by id.
    pub(crate) live: Mutex<HashMap<String, Arc<Sandbox>>>,
    /// Per-sandbox lifecycle locks (checkpoint, rollback, start, delete).
    locks: Mutex<HashMap<String, Arc<AsyncMutex<()>>>>,
    /// Read side: any verb that creates or deletes subvolumes. Write side: GC.
    pub(crate) store_lock: RwLock<()>,
    /// Flushes dirty data in the background after commands ran.
    pub(crate) flusher: crate::flusher::Flusher,
    /// Deletes unreferenced subvolumes when the engine is idle.
    pub(crate) reaper: crate::reaper::Reaper,
    /// Prepared rollback targets.
    pub(crate) spares: Arc<crate::spares::Spares>,
    /// Process tracers (and their templates) by sandbox id; one belongs to
    /// one init: a new init (boot) or none (halt) drops it.
    pub(crate) tracers: Mutex<HashMap<String, Arc<sandtree_proc::Tracer>>>,
    /// Lists of each running sandbox's SysV IPC objects, by sandbox id
    /// (`sysv_ipc.rs`); one belongs to one init, like a tracer.
    pub(crate) ipc_probes: Mutex<HashMap<String, Arc<crate::sysv_ipc::Probe>>>,
    /// What the tracers count, and the switches tests set (shared by all).
    pub(crate) instruments: Arc<sandtree_proc::Instruments>,
    /// Sandboxes with a template eviction pending or running, and whether
    /// a checkpoint since its measurement began asks for another run.
    pub(crate) evicting: Mutex<std::collections::HashMap<String, bool>>,
    /// Runs of layers being squashed (`layer_squash.rs`).
    pub(crate) squashing: Mutex<std::collections::HashSet<Vec<String>>>,
    /// Prepared next layers of layered sandboxes (`next_layers.rs`).
    pub(crate) nexts: crate::next_layers::NextLayers,
    /// Lower layers of images, by name (see [`Engine::image_layers`]).
    pub(crate) image_layers: Mutex<HashMap<String, Vec<StoredLayer>>>,
    /// Layers pinned by operations in flight, with their pin counts.
    pub(crate) pinned: Mutex<HashMap<String, usize>>,
    /// One squash at a time.
    pub(crate) squash_gate: Arc<tokio::sync::Semaphore>,
    /// Squashed runs of layers (top first) → the layer that replaces them.
    pub(crate) squashed: Mutex<HashMap<Vec<String>, String>>,
    /// What `sandtree_fs::squash::scan` found in a read-only layer.
    pub(crate) layer_scans: Mutex<HashMap<String, sandtree_fs::squash::LayerScan>>,
    /// Per sandbox: held while one of its checkpoints' process images is
    /// written (`checkpoint_image.rs`), so that they are written in order
    /// (each against its parent's) and an eviction waits for them.
    pub(crate) image_writes: Mutex<HashMap<String, Arc<AsyncMutex<()>>>>,
    /// Checkpoints whose image is to be written, each with its parent:
    /// their templates are not evicted, and neither their images nor the
    /// parent's (and its sources) are pruned meanwhile.
    pub(crate) images_pending: Mutex<HashMap<String, Option<String>>>,
    /// Background work a stopping daemon waits for (see [`Engine::settle`]).
    releasing: Mutex<tokio::task::JoinSet<()>>,
    /// The daemon's network (`None`: sandboxes get none).
    pub(crate) network: Option<Arc<sandtree_net::Network>>,
    /// Each running sandbox's router, by id; one belongs to one init, like
    /// a tracer (`sandbox_network.rs`).
    pub(crate) networks: Mutex<HashMap<String, Arc<sandtree_net::Attachment>>>,
    /// Ports exposed on the host (`sandbox_ports.rs`).
    pub(crate) ports: crate::sandbox_ports::Ports,
    /// The engine itself, for background tasks.
    pub(crate) this: std::sync::Weak<Engine>,
}

impl Engine {
    /// Opens the state store and metadata, makes sure the default image
    /// exists, re-adopts (or restarts) the sandboxes that were running and
    /// collects orphans left by a crash.
    ///
    /// `zygote` must have been started by [`Zygote::start`] before the process
    /// created any thread (before the tokio runtime).
    pub async fn open(cfg: Config, zygote: Zygote) -> Result<Arc<Engine>> {
        prepare_data_dir(&cfg.data_dir)?;
        let vcfg = cfg.volume_config();
        let volume = tokio::task::spawn_blocking(move || Volume::open(&vcfg)).await??;
        let dynmods = match sandtree_sandbox::cgroup::favor_dynamic_modifications() {
            Ok(true) => {
                tracing::debug!("cgroup favordynmods is on");
                true
            }
            Ok(false) => {
                tracing::info!("no cgroup2 mount: sandbox starts may wait for RCU grace periods");
                false
            }
            Err(e) => {
                tracing::warn!("cannot turn on cgroup favordynmods ({e}): sandbox starts may be slower");
                false
            }
        };
        let meta = Meta::open(&cfg.meta_path())?;
        let cfg_spares = cfg.spare_layers;
        let flusher = crate::flusher::Flusher::start(volume.root().to_path_buf());
        let reaper = crate::reaper::Reaper::start(flusher.clone(), volume.root().to_path_buf());
        set_mode(&cfg.meta_path(), 0o600)?;
        let network = crate::sandbox_network::start(&cfg)?;
        let engine = Arc::new_cyclic(|this| Engine {
            network,
            networks: Mutex::new(HashMap::new()),
            ports: Default::default(),
            dynmods,
            cfg,
            volume,
            meta: Arc::new(meta),
            zygote: Arc::new(zygote),
            live: Mutex::new(HashMap::new()),
            locks: Mutex::new(HashMap::new()),
            releasing: Mutex::new(tokio::task::JoinSet::new()),
            store_lock: RwLock::new(()),
            flusher,
            reaper,
            spares: Arc::new(crate::spares::Spares::new(cfg_spares)),
            tracers: Mutex::new(HashMap::new()),
            ipc_probes: Mutex::new(HashMap::new()),
            instruments: Default::default(),
            evicting: Mutex::new(Default::default()),
            squashing: Mutex::new(Default::default()),
            nexts: Default::default(),
            image_layers: Mutex::new(HashMap::new()),
            pinned: Mutex::new(HashMap::new()),
            squash_gate: Arc::new(tokio::sync::Semaphore::new(1)),
            squashed: Mutex::new(HashMap::new()),
            layer_scans: Mutex::new(HashMap::new()),
            image_writes: Mutex::new(HashMap::new()),
            images_pending: Mutex::new(HashMap::new()),
            this: this.clone(),
        });
        engine.ensure_default_image().await?;
        engine.recover().await?;
        if let Some(net) = &engine.network {
            net.sweep();
        }
        engine.settle_images_at_start()?;
        crate::spares::Spares::start(&engine);
        for rec in engine.meta.sandboxes()? {
            if let (DesiredState::Running, Some(ck)) = (rec.state, &rec.base_checkpoint) {
                // (Restarted: its processes are not restored.)
                engine.spares.want(&rec.id, ck, false);
            }
        }
        Ok(engine)
    }

    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Subvolume deletions queued in the background (`reaper.rs`), not
    /// done yet.
    pub fn pending_deletions(&self) -> usize {
        self.reaper.pending()
    }

    pub fn volume(&self) -> &Volume {
        &self.volume
    }

    pub fn meta(&self) -> &Meta {
        &self.meta
    }

    /// Takes the lifecycle lock of one sandbox.
    pub(crate) async fn lock_sandbox(&self, id: &str) -> OwnedMutexGuard<()> {
        let lock = {
            let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
            locks.entry(id.to_string()).or_default().clone()
        };
        lock.lock_owned().await
    }

    pub(crate) fn forget_lock(&self, id: &str) {
        self.locks.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
    }

    pub(crate) fn live_get(&self, id: &str) -> Option<Arc<Sandbox>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner()).get(id).cloned()
    }

    pub(crate) fn live_set(&self, id: &str, sb: Option<Arc<Sandbox>>) -> Option<Arc<Sandbox>> {
        // Templates live in the old init's pid namespace: they go with it,
        // now (whoever else still holds the handle).
        let tracer = self.tracers.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
        if let Some(t) = tracer {
            block(|| t.shutdown());
        }
        // (It holds the old init's IPC namespace.)
        self.ipc_probes.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
        // Its router goes with the old init's network namespace.
        let router = self.networks.lock().unwrap_or_else(|p| p.into_inner()).remove(id);
        drop(router);
        let mut live = self.live.lock().unwrap_or_else(|p| p.into_inner());
        match sb {
            Some(sb) => live.insert(id.to_string(), sb),
            None => live.remove(id),
        }
    }

    /// What the process engine counted since this engine started
    /// (templates made each way, pages copied by holders, ...).
    pub fn process_stats(&self) -> sandtree_proc::ProcessStats {
        self.instruments.stats()
    }

    /// Switches that force the process engine's rare paths, for tests.
    pub fn test_switches(&self) -> &sandtree_proc::TestSwitches {
        &self.instruments.switches
    }

    /// The tracer of a running sandbox (started on first use).
    pub(crate) fn tracer(&self, id: &str) -> Result<Arc<sandtree_proc::Tracer>> {
        let mut tracers = self.tracers.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(t) = tracers.get(id) {
            return Ok(t.clone());
        }
        let t = Arc::new(
            sandtree_proc::Tracer::start(self.cfg.incremental_min_rss, self.pool_cgroup(id), self.instruments.clone())
                .map_err(|e| Error::Internal(format!("start the tracer thread: {e}")))?,
        );
        tracers.insert(id.to_string(), t.clone());
        Ok(t)
    }

    /// At a checkpoint, once nothing in sandbox `id` (init `init`) can
    /// change them: its `/dev/shm` and its SysV IPC objects saved into
    /// subvolume `subvol` (`dev_shm.rs`, `sysv_ipc.rs`). The bytes of
    /// `/dev/shm` copied.
    pub(crate) fn save_namespace_state(&self, id: &str, init: i32, subvol: &std::path::Path) -> Result<u64> {
        let bytes = crate::dev_shm::save(init, self.sandbox_root_ids(), subvol)?;
        crate::sysv_ipc::save(&*self.ipc_probe(id, init)?, self.sandbox_root_ids(), subvol)?;
        Ok(bytes)
    }

    /// The lists of SysV IPC objects of sandbox `id`, whose init is host
    /// pid `init` (opened at the first call for that init).
    pub(crate) fn ipc_probe(&self, id: &str, init: i32) -> Result<Arc<crate::sysv_ipc::Probe>> {
        let mut probes = self.ipc_probes.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = probes.get(id).filter(|p| p.init == init) {
            return Ok(p.clone());
        }
        let p = Arc::new(crate::sysv_ipc::Probe::open(init)?);
        probes.insert(id.to_string(), p.clone());
        Ok(p)
    }

    /// The cgroup a new tracer of sandbox `id` keeps its pool in (`None`:
    /// the sandbox's own, as a slower kill list the only cost).
    fn pool_cgroup(&self, id: &str) -> Option<sandtree_proc::cgroup::PoolCgroup> {
        if !self.dynmods {
            return None;
        }
        let sb = self.live_get(id)?;
        let cg = sb.cgroup();
        let opened = cg.ensure_pool().map_err(|e| e.to_string()).and_then(|()| {
            sandtree_proc::cgroup::PoolCgroup::open(&cg.pool_dir(), cg.procs_dir()).map_err(|e| e.to_string())
        });
        match opened {
            Ok(pc) => Some(pc),
            Err(e) => {
                tracing::warn!(sandbox = id, "process templates stay in the sandbox's cgroup: {e}");
                None
            }
        }
    }

    /// The tracer of a sandbox, if it has one.
    pub(crate) fn tracer_get(&self, id: &str) -> Option<Arc<sandtree_proc::Tracer>> {
        self.tracers.lock().unwrap_or_else(|p| p.into_inner()).get(id).cloned()
    }

    /// What the pool holds for checkpoint `ck` of sandbox `id` (the tracer
    /// thread may be busy with a capture for a few ms: not on an async
    /// worker's time).
    pub(crate) fn templates_of(&self, id: &str, ck: &str) -> Option<sandtree_proc::TemplateStatus> {
        let t = self.tracer_get(id)?;
        block(|| t.status(ck).ok().flatten())
    }

    /// Looks a sandbox up, checking the id's shape first (ids become paths).
    pub(crate) fn record(&self, id: &str) -> Result<SandboxRecord> {
        if !util::is_valid_id("sb", id) {
            return Err(Error::SandboxNotFound(id.to_string()));
        }
        self.meta.sandbox(id)?.ok_or_else(|| Error::SandboxNotFound(id.to_string()))
    }

    pub(crate) fn checkpoint_record(&self, id: &str) -> Result<sandtree_meta::CheckpointRecord> {
        if !util::is_valid_id("ck", id) {
            return Err(Error::CheckpointNotFound(id.to_string()));
        }
        self.meta.checkpoint(id)?.ok_or_else(|| Error::CheckpointNotFound(id.to_string()))
    }

    /// Path of a writable subvolume `<sandbox-id>/<gen>`. Each sandbox has
    /// its own directory so that concurrent snapshots (fork) do not queue on
    /// one directory's lock in the kernel.
    pub(crate) fn subvol_path(&self, subvol: &str) -> PathBuf {
        self.volume.sandboxes_dir().join(subvol)
    }

    /// A fresh name for a writable layer of sandbox `id` (`<id>/<gen>`),
    /// its parent directory made.
    pub(crate) fn new_layer_name(&self, id: &str) -> Result<String> {
        self.subvol_parent(id)?;
        Ok(format!("{id}/{}", &util::new_id("g")[2..]))
    }

    /// Creates the per-sandbox directory that holds its subvolumes.
    pub(crate) fn subvol_parent(&self, id: &str) -> Result<PathBuf> {
        let dir = self.volume.sandboxes_dir().join(id);
        std::fs::create_dir_all(&dir).map_err(|e| Error::Internal(format!("cannot create {}: {e}", dir.display())))?;
        Ok(dir)
    }

    /// Absolute paths of layers named by their path under the volume root.
    pub(crate) fn layer_paths(&self, layers: &[String]) -> Vec<PathBuf> {
        layers.iter().map(|l| self.volume.root().join(l)).collect()
    }

    /// A sandbox's writable subvolume `<id>/<gen>` as a layer name (its path
    /// under the volume root), as checkpoints and lowers name it.
    pub(crate) fn subvol_layer(subvol: &str) -> String {
        format!("sandboxes/{subvol}")
    }

    /// Queues read-only layers for deletion unless a row still names them
    /// (or a spare, a next layer or the squash map holds them). Reads every
    /// row's layers once: off the hot path (a background task).
    pub(crate) fn discard_layers_if_unused(&self, layers: Vec<String>) {
        if layers.is_empty() {
            return;
        }
        let Some(engine) = self.this.upgrade() else { return };
        tokio::spawn(async move {
            let _store = engine.store_lock.read().await;
            engine.prune_squashed();
            let used = match engine.meta.layers_in_use() {
                Ok(used) => used,
                Err(e) => return tracing::warn!("cannot tell which layers are in use ({e}): left for gc"),
            };
            let held = engine.layers_held();
            for layer in layers.iter().filter(|l| !used.contains(*l) && !held.contains(*l)) {
                // (A deleted sandbox's directory goes with its last layer.)
                engine.reaper.discard(engine.volume.root().join(layer), layer.starts_with("sandboxes/"));
            }
        });
    }

    /// The host uid and gid of a sandbox's root.
    pub(crate) fn sandbox_root_ids(&self) -> (u32, u32) {
        (self.cfg.uid_base, self.cfg.uid_base)
    }

    pub(crate) fn checkpoint_path(&self, id: &str) -> PathBuf {
        self.volume.checkpoints_dir().join(id)
    }

    /// Limits of a request, completed with the daemon defaults.
    pub(crate) fn effective_limits(&self, req: &Limits) -> Limits {
        let d = &self.cfg.default_limits;
        Limits {
            memory_bytes: req.memory_bytes.or(d.memory_bytes),
            pids: req.pids.or(d.pids),
            cpu_millicores: req.cpu_millicores.or(d.cpu_millicores),
        }
    }

    /// An image's lower layers (remembered: an image does not change while
    /// it exists; `images.rs` forgets it when it is written or removed).
    pub(crate) fn image_layers(&self, image: &str) -> Result<Vec<StoredLayer>> {
        if let Some(layers) = self.image_layers.lock().unwrap_or_else(|p| p.into_inner()).get(image) {
            return Ok(layers.clone());
        }
        let rec = self.meta.image(image)?.ok_or_else(|| Error::ImageNotFound(image.to_string()))?;
        let layers: Vec<StoredLayer> = serde_json::from_value(rec.layers)
            .map_err(|e| Error::Internal(format!("image {image} has unreadable layers: {e}")))?;
        self.image_layers.lock().unwrap_or_else(|p| p.into_inner()).insert(image.to_string(), layers.clone());
        Ok(layers)
    }

    /// Forgets what [`Engine::image_layers`] remembers of `image`.
    pub(crate) fn forget_image_layers(&self, image: &str) {
        self.image_layers.lock().unwrap_or_else(|p| p.into_inner()).remove(image);
    }

    /// Starts the processes of a sandbox on its current writable subvolume
    /// and registers it as live. Blocking parts run off the async threads.
    pub(crate) async fn boot(&self, rec: &SandboxRecord) -> Result<Arc<Sandbox>> {
        // A layer a row names but the disk lacks (lost in a host crash
        // before btrfs committed it): say so, never boot on a made-up one.
        let mut layers = vec![Engine::subvol_layer(&rec.subvol)];
        layers.extend(rec.lowers.iter().cloned());
        if let Some(missing) = layers.iter().find(|l| !sandtree_fs::is_subvolume(&self.volume.root().join(l))) {
            return Err(Error::Internal(format!(
                "layer {missing} of sandbox {} is missing from the volume (lost in a host crash before btrfs wrote it?)",
                rec.id
            )));
        }
        let spec = self.spec(rec)?;
        // On the blocking pool, so that several boots (a fork) run on
        // several zygote workers at once.
        let zygote = self.zygote.clone();
        let init = tokio::task::spawn_blocking(move || zygote.spawn(&spec)).await??;
        // The router is attached while the daemon connects to init.
        let pid = init.pid;
        let host = self.cfg.host_config();
        let (sandbox, network) = tokio::join!(Sandbox::connect(&host, &rec.id, init), self.attach_network(rec, pid));
        let sandbox = Arc::new(sandbox?);
        let network = match network {
            Ok(n) => n,
            Err(e) => {
                let _ = sandbox.kill().await;
                return Err(e);
            }
        };
        self.live_set(&rec.id, Some(sandbox.clone()));
        if let Some(n) = network {
            self.networks.lock().unwrap_or_else(|p| p.into_inner()).insert(rec.id.clone(), Arc::new(n));
        }
        Ok(sandbox)
    }

    /// The writable top a rollback to (or spare of) checkpoint `ck` puts
    /// sandbox `id` on: the copy the checkpoint made with itself if there is
    /// one; else, layered, a new empty subvolume over the checkpoint's
    /// layers; else a writable snapshot of its layer over the layers under
    /// it. A half-made one is queued for deletion on failure.
    pub(crate) async fn rollback_layer(&self, id: &str, ck: &sandtree_meta::CheckpointRecord) -> Result<LayerStack> {
        if let Some(subvol) = self.spares.take_made(id, &ck.id) {
            return Ok(LayerStack { subvol, lowers: ck.lowers.clone(), base_transid: ck.transid });
        }
        if self.cfg.layered {
            return Ok(LayerStack { subvol: self.fresh_layer(id)?, lowers: ck.stack(), base_transid: 0 });
        }
        let subvol = self.new_layer_name(id)?;
        let (src, dst) = (self.volume.root().join(&ck.layer), self.subvol_path(&subvol));
        match tokio::task::spawn_blocking(move || sandtree_fs::snapshot(&src, &dst, false)).await? {
            Ok(()) => Ok(LayerStack { subvol, lowers: ck.lowers.clone(), base_transid: ck.transid }),
            Err(e) => {
                self.discard_subvol_later(&subvol);
                Err(Error::fs("writable copy of a checkpoint", e))
            }
        }
    }

    /// A new, empty writable generation `<id>/<gen>` of sandbox `id` (to
    /// stack over read-only layers). No btrfs commit.
    pub(crate) fn fresh_layer(&self, id: &str) -> Result<String> {
        let subvol = self.new_layer_name(id)?;
        let path = self.subvol_path(&subvol);
        block(|| sandtree_fs::create_subvolume(&path)).map_err(|e| Error::fs("new writable layer", e))?;
        Ok(subvol)
    }

    /// Detached overlay mounts of `layers`, built by the zygote (blocking
    /// part off the async threads).
    pub(crate) async fn build_layers(&self, layers: Vec<sandtree_sandbox::OverlayLayer>) -> Result<Vec<OwnedFd>> {
        let zygote = self.zygote.clone();
        Ok(tokio::task::spawn_blocking(move || zygote.build_layers(&layers)).await??)
    }

    /// What the zygote needs to start `rec`.
    pub(crate) fn spec(&self, rec: &SandboxRecord) -> Result<SandboxSpec> {
        let layers = self.image_layers(&rec.image)?;
        let limits: Limits = serde_json::from_value(rec.limits.clone()).unwrap_or_default();
        Ok(SandboxSpec {
            id: rec.id.clone(),
            hostname: rec.id.clone(),
            layers: overlay_layers(
                &layers,
                &self.volume.images_dir(),
                &self.subvol_path(&rec.subvol),
                &self.layer_paths(&rec.lowers),
            ),
            limits: sandtree_sandbox::Limits {
                memory_bytes: limits.memory_bytes,
                pids: limits.pids,
                cpu_millicores: limits.cpu_millicores,
            },
        })
    }

    /// Kills a sandbox's processes (if any) and forgets its live handle. Its
    /// cgroup and run directory stay for the next boot of the same sandbox.
    pub(crate) async fn halt(&self, id: &str) -> Result<()> {
        if let Some(sb) = self.live_set(id, None) {
            sb.stop().await?;
        }
        Ok(())
    }

    /// Like [`Engine::halt`]; the cgroup and run directory are then removed
    /// in the background (nothing waits for the kernel to let go of them).
    pub(crate) async fn halt_and_release(&self, id: &str) -> Result<()> {
        if let Some(sb) = self.live_set(id, None) {
            sb.stop().await?;
            self.spawn_settled(async move {
                if let Err(e) = sb.release().await {
                    tracing::warn!(sandbox = sb.id(), "cannot remove cgroup or run dir: {e} (gc will retry)");
                }
            });
        }
        Ok(())
    }

    /// Runs `work` in the background, as work [`Engine::settle`] waits for.
    pub(crate) fn spawn_settled(&self, work: impl std::future::Future<Output = ()> + Send + 'static) {
        let mut releasing = self.releasing.lock().unwrap_or_else(|p| p.into_inner());
        while releasing.try_join_next().is_some() {}
        releasing.spawn(work);
    }

    /// Waits (up to `limit`) for the background work a stopping daemon must
    /// not cut short: the removals of deleted sandboxes' cgroups, and the
    /// measurements of new checkpoints' sizes. A cgroup whose removal is cut
    /// short stays behind (its run directory too, so the next daemon's GC
    /// finds it, but only on the same data directory), and a removed one
    /// whose memory charges were not dropped first lingers in the kernel as
    /// a dying cgroup (`Cgroup::reclaim_charges`); a checkpoint whose
    /// measurement is cut short keeps no size. Returns how many were still
    /// running at `limit`.
    pub async fn settle(&self, limit: std::time::Duration) -> usize {
        let mut set = std::mem::take(&mut *self.releasing.lock().unwrap_or_else(|p| p.into_inner()));
        let _ = tokio::time::timeout(limit, async { while set.join_next().await.is_some() {} }).await;
        set.len()
    }

    /// The live handle of a sandbox, starting it when it is stopped.
    pub(crate) async fn running(&self, id: &str) -> Result<Arc<Sandbox>> {
        if let Some(sb) = self.live_get(id).filter(|s| s.is_alive()) {
            return Ok(sb);
        }
        self.start_sandbox(id).await?;
        self.live_get(id).ok_or_else(|| Error::NotRunning(id.to_string()))
    }

    /// Starts a stopped sandbox again from its filesystem state.
    pub async fn start_sandbox(&self, id: &str) -> Result<SandboxInfo> {
        let _lock = self.lock_sandbox(id).await;
        let rec = self.record(id)?;
        if self.live_get(id).is_some_and(|s| s.is_alive()) {
            return self.sandbox_info(&rec, false);
        }
        let _store = self.store_lock.read().await;
        self.halt(id).await?;
        self.boot(&rec).await?;
        self.meta.set_sandbox_state(id, DesiredState::Running, None)?;
        self.sandbox_info(&self.record(id)?, false)
    }

    /// Stops a sandbox's processes; its filesystem stays.
    pub async fn stop_sandbox(&self, id: &str) -> Result<SandboxInfo> {
        // (Its templates end with it: its images still being written first.)
        self.settle_images_of(Some(id), crate::checkpoint_image::IMAGES_BEFORE_STOP).await;
        let _lock = self.lock_sandbox(id).await;
        self.record(id)?;
        // Released synchronously: a `start` right after must not race the cleanup.
        if let Some(sb) = self.live_set(id, None) {
            sb.kill().await?;
        }
        self.meta.set_sandbox_state(id, DesiredState::Stopped, Some("stopped by request"))?;
        self.sandbox_info(&self.record(id)?, false)
    }

    /// The API view of a sandbox; `with_usage` reads its cgroup and disk usage.
    pub(crate) fn sandbox_info(&self, rec: &SandboxRecord, with_usage: bool) -> Result<SandboxInfo> {
        let live = self.live_get(&rec.id).filter(|s| s.is_alive());
        let status = if live.is_some() { SandboxStatus::Running } else { SandboxStatus::Stopped };
        let status_reason = match (&live, rec.state) {
            (Some(_), _) => rec.status_reason.clone(),
            (None, DesiredState::Stopped) => rec.status_reason.clone(),
            (None, DesiredState::Running) => Some(
                "its init exited (killed or out of memory); the filesystem is intact: start it again with `sandtree start`"
                    .into(),
            ),
        };
        let usage = if with_usage {
            let mut usage = Usage::default();
            if let Some(u) = live.as_ref().and_then(|sb| sb.usage().ok()) {
                usage.memory_bytes = u.memory_bytes;
                usage.memory_limit_bytes = u.memory_limit;
                usage.pids = u.pids;
                usage.pids_limit = u.pids_limit;
                usage.cpu_usec = u.cpu_usec;
            }
            usage.disk_bytes =
                sandtree_fs::bytes_written_since(&self.subvol_path(&rec.subvol), rec.base_transid).unwrap_or(0);
            Some(usage)
        } else {
            None
        };
        Ok(SandboxInfo {
            id: rec.id.clone(),
            image: rec.image.clone(),
            status,
            status_reason,
            created_at: rec.created_at.clone(),
            labels: rec.labels.clone(),
            limits: serde_json::from_value(rec.limits.clone()).unwrap_or_default(),
            base_checkpoint: rec.base_checkpoint.clone(),
            init_pid: live.map(|s| s.init_pid()),
            network: self.network_info(rec),
            usage,
        })
    }

    pub(crate) fn freeze_timeout(&self) -> Duration {
        Duration::from_millis(self.cfg.freeze_timeout_ms)
    }
}

/// Creates the data directory. Mode 0711: sandboxes' inits run as
/// unprivileged host ids and must traverse it to reach their run directory;
/// nothing inside can be listed, and secrets in it are 0600.
fn prepare_data_dir(dir: &std::path::Path) -> Result<()> {
    std::fs::create_dir_all(dir)
        .map_err(|e| Error::Internal(format!("cannot create data dir {}: {e}", dir.display())))?;
    set_mode(dir, 0o711)
}

fn set_mode(path: &std::path::Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(|e| Error::Internal(format!("cannot set mode {mode:o} on {}: {e}", path.display())))
}
