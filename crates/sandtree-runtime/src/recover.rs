//! Start-up recovery after a daemon restart (clean or SIGKILL).
//!
//! For every sandbox row:
//! - its init still answers on its control socket → re-adopted, processes
//!   untouched;
//! - it should run but its init is gone (host reboot, crash) → started again
//!   from its filesystem state, with a status reason that says processes
//!   from before the restart were lost;
//! - it was stopped → left stopped.
//!
//! Then GC removes whatever a crash left half-made.

use sandtree_meta::DesiredState;

use crate::{Engine, Result};

pub(crate) const RESTARTED_REASON: &str =
    "restarted after a daemon restart: the filesystem is intact, processes from before the restart were lost";

impl Engine {
    pub(crate) async fn recover(&self) -> Result<()> {
        let host = self.cfg.host_config();
        for rec in self.meta.sandboxes()? {
            let adopted = match sandtree_sandbox::Sandbox::adopt(&host, &rec.id).await {
                Ok(sb) => sb,
                Err(e) => {
                    tracing::warn!(sandbox = rec.id, "cannot re-adopt, killing what is left of it: {e}");
                    if let Err(e) = sandtree_sandbox::Sandbox::destroy_stale(&host, &rec.id) {
                        tracing::warn!(sandbox = rec.id, "cannot clean up: {e}");
                    }
                    None
                }
            };
            // A daemon killed inside a rollback may have committed the new
            // layer while init still runs on the old one (or the reverse):
            // such an init is killed and the sandbox booted on the layer
            // metadata names.
            let adopted = match adopted {
                Some(sb) if !self.runs_on_its_layer(&sb, &rec) => {
                    tracing::warn!(sandbox = rec.id, "init runs on another layer than recorded: restarting it");
                    let _ = sb.kill().await;
                    None
                }
                other => other,
            };
            match (adopted, rec.state) {
                (Some(sb), DesiredState::Running) => {
                    self.live_set(&rec.id, Some(std::sync::Arc::new(sb)));
                    self.adopt_network(&rec).await;
                }
                (Some(sb), DesiredState::Stopped) => {
                    let _ = sb.kill().await;
                }
                (None, DesiredState::Running) => match self.boot(&rec).await {
                    Ok(_) => self.meta.set_sandbox_state(&rec.id, DesiredState::Running, Some(RESTARTED_REASON))?,
                    Err(e) => {
                        let reason = format!("could not be restarted after a daemon restart: {e}");
                        tracing::warn!(sandbox = rec.id, "{reason}");
                        self.meta.set_sandbox_state(&rec.id, DesiredState::Stopped, Some(&reason))?;
                    }
                },
                (None, DesiredState::Stopped) => {}
            }
        }
        let report = self.collect(false).await?;
        if !report.orphans_removed.is_empty() || !report.stale_runtime_removed.is_empty() {
            tracing::info!(
                orphans = ?report.orphans_removed,
                stale = ?report.stale_runtime_removed,
                "recovery removed leftovers of interrupted operations"
            );
        }
        Ok(())
    }

    fn runs_on_its_layer(&self, sb: &sandtree_sandbox::Sandbox, rec: &sandtree_meta::SandboxRecord) -> bool {
        let expected = self.subvol_path(&rec.subvol).join("layers").join("0").join("upper");
        sb.root_upper().is_some_and(|upper| upper == expected)
    }
}
