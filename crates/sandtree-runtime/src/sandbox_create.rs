//! `create`: a new sandbox on an image.
//!
//! Order of operations (the metadata commit is last, so a crash at any step
//! leaves at most an orphan subvolume / process that GC removes):
//! 1. create the writable subvolume `sandboxes/<id>/1` (empty: the image is
//!    the overlay's lower layer, nothing is copied);
//! 2. spawn the sandbox's init through the zygote (namespaces, cgroup,
//!    overlay root, seccomp) and connect to it;
//! 3. commit the sandbox row.

use std::time::Instant;

use sandtree_api::{CreateSandboxRequest, CreateSandboxResponse, SandboxInfo, SandboxList};
use sandtree_meta::{DesiredState, SandboxRecord};

use crate::{Engine, Error, Result, util};

impl Engine {
    pub async fn create_sandbox(&self, req: CreateSandboxRequest) -> Result<CreateSandboxResponse> {
        let t0 = Instant::now();
        let image = req.image.clone().unwrap_or_else(|| sandtree_fs::DEFAULT_IMAGE.to_string());
        self.image_layers(&image)?;
        let network = self.network_for_create(&req.network)?;
        let _store = self.store_lock.read().await;
        let _busy = self.flusher.busy();
        let id = util::new_id("sb");
        let rec = SandboxRecord {
            id: id.clone(),
            image,
            tree_id: id.clone(),
            created_at: util::now_rfc3339(),
            labels: req.labels,
            limits: serde_json::to_value(self.effective_limits(&req.limits))
                .map_err(|e| Error::Internal(e.to_string()))?,
            subvol: format!("{id}/1"),
            base_checkpoint: None,
            base_transid: 0,
            state: DesiredState::Running,
            status_reason: None,
            lowers: Vec::new(),
            network,
        };
        self.subvol_parent(&id)?;
        let path = self.subvol_path(&rec.subvol);
        tokio::task::block_in_place(|| sandtree_fs::create_subvolume(&path))
            .map_err(|e| Error::fs("create sandbox", e))?;
        let booted = async {
            self.boot(&rec).await?;
            self.meta.insert_sandbox(&rec)?;
            Ok::<_, Error>(())
        }
        .await;
        if let Err(e) = booted {
            self.discard(&rec.id, &rec.subvol).await;
            return Err(e);
        }
        let sandbox = self.sandbox_info(&rec, false)?;
        self.want_next(&rec.id);
        Ok(CreateSandboxResponse { sandbox, duration_ms: util::ms_since(t0) })
    }

    /// Undoes a half-made sandbox: kills its processes and queues its
    /// subvolume (and directory) for deletion.
    pub(crate) async fn discard(&self, id: &str, subvol: &str) {
        if let Err(e) = self.halt_and_release(id).await {
            tracing::warn!(sandbox = id, "cleanup: cannot kill processes: {e}");
        }
        self.reaper.discard(self.subvol_path(subvol), true);
    }

    pub async fn get_sandbox(&self, id: &str) -> Result<SandboxInfo> {
        let rec = self.record(id)?;
        tokio::task::block_in_place(|| self.sandbox_info(&rec, true))
    }

    pub async fn list_sandboxes(&self) -> Result<SandboxList> {
        let recs = self.meta.sandboxes()?;
        let sandboxes = recs.iter().map(|r| self.sandbox_info(r, false)).collect::<Result<Vec<_>>>()?;
        Ok(SandboxList { sandboxes })
    }
}
